/* The "Contents" sidebar marks the section the reader is in, on long pages too.
   The theme marks a section when its heading crosses a band at the top of the
   window (the top 30%); a scroll longer than the band in one step (Page Down, the
   scroll bar, a link or a search hit) carries the heading past it unseen, and on the
   API page, whose headings are screens apart, an earlier section then stayed marked
   for many screens. After every scroll this marks the last heading above the band's
   lower edge, with the theme's own classes, and scrolls a contents list taller than
   the window to it. */
(function () {
  function follow() {
    const nav = document.querySelector("#pst-page-toc-nav");
    if (!nav) return;
    const links = Array.from(nav.querySelectorAll("a[href^='#']"));
    const entries = Array.from(nav.querySelectorAll(".toc-entry"));
    const headings = links.map(function (link) {
      const section = document.getElementById(
        decodeURIComponent(link.hash.slice(1)));
      return section &&
        (section.querySelector("h1, h2, h3, h4, h5, h6") || section);
    });
    if (!headings.some(Boolean)) return;
    let pending = false;
    let shown = null;

    function mark() {
      pending = false;
      const line = window.innerHeight * 0.3;
      let current = null;
      headings.forEach(function (heading, i) {
        if (heading && heading.getBoundingClientRect().top <= line) {
          current = links[i];
        }
      });
      if (current === null || current === shown) return;  // nothing new
      shown = current;
      links.forEach(function (link) {
        if (link === current) {
          link.classList.add("active");
          link.setAttribute("aria-current", "true");
        } else {
          link.classList.remove("active");
          link.removeAttribute("aria-current");
        }
      });
      entries.forEach(function (entry) {
        entry.classList.toggle("active", entry.contains(current));
      });
      // a long contents list scrolls: bring the marked entry into its view
      const box = nav.closest(".bd-sidebar-secondary");
      if (box && box.scrollHeight > box.clientHeight) {
        const at = current.getBoundingClientRect();
        const view = box.getBoundingClientRect();
        if (at.bottom > view.bottom) box.scrollTop += at.bottom - view.bottom + 24;
        else if (at.top < view.top) box.scrollTop -= view.top - at.top + 24;
      }
    }

    window.addEventListener("scroll", function () {
      if (!pending) {
        pending = true;
        // after the theme's own observer, which may run in the same frame
        window.requestAnimationFrame(function () { setTimeout(mark, 0); });
      }
    }, { passive: true });
    mark();
  }
  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", follow);
  } else {
    follow();
  }
})();
