// `tributary report RUN --out report.html`: one self-contained HTML page about a run (no network at view time: the
// charts are inline SVG, the one script only checks the page). Sections, each always present so a reader (and the
// browser test) finds them in the same place: overview, loss (vs tokens and vs wall clock), workers (tokens/s and MFU
// per worker), communication (bytes and blocked share per outer step), timeline (per worker: computing vs blocked),
// faults (membership changes, rejected updates, dropped tasks), DiPaCo (per-path losses, routing table), pipeline
// (per-stage times), configuration. A section with nothing to show for this kind of run says why in a p.na.
#pragma once

#include <string>

#include "tributary/core/fs.h"
#include "tributary/report/run_files.h"

namespace tributary::report {

std::string render_html(const RunFiles& run);
// Reads `run_dir` (errors: read_run_files) and writes the page atomically to `out` ("" = RUN/report.html).
fs::path write_report(const fs::path& run_dir, const fs::path& out);

}  // namespace tributary::report
