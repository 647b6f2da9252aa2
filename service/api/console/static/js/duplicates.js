// DUPLICATES VIEW: a placeholder. The console calls only the public API, and no route lists
// possible duplicates yet (issue 35 reports them per enrollment, `possible_duplicate_of`, which
// the Enroll page shows). When the service gains such a route, list its pairs here with links to
// both subjects (docs/console.md says the same).

import { h, replace } from "./dom.js";

export async function render(main) {
  replace(
    main,
    h("h1", { tabindex: "-1" }, "Possible duplicates"),
    h(
      "section",
      { class: "panel" },
      h("p", {}, "One person enrolled under two subjects makes identification answer either of them. The service does not list such pairs through its API yet."),
      h(
        "p",
        {},
        "Meanwhile, each enrollment reports a possible duplicate when the service finds one: the Enroll page shows it beside the new face (",
        h("code", {}, "possible_duplicate_of"),
        ").",
      ),
    ),
  );
}
