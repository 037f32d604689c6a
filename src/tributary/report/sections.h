// The run report's sections (report/html_report.h) and the small HTML helpers they share. Internal to report/.
#pragma once

#include <string>
#include <vector>

#include "tributary/report/run_files.h"
#include "tributary/report/svg_chart.h"

namespace tributary::report {

struct Section {
  std::string id, title, html;
  bool applies = true;  // false: this kind of run has no such part (DiPaCo's paths on a DiLoCo run): left out
};

// An HTML table; cells are escaped.
std::string table(const std::vector<std::string>& header, const std::vector<std::vector<std::string>>& rows);
// What a section says when this kind of run has nothing for it.
std::string not_applicable(const std::string& why);
std::string fixed(double value, int digits);
double median(std::vector<double> values);

Section overview_section(const RunFiles& run);
Section loss_section(const RunFiles& run);
Section workers_section(const RunFiles& run);
Section communication_section(const RunFiles& run);
Section merges_section(const RunFiles& run);
Section scores_section(const RunFiles& run);
Section timeline_section(const RunFiles& run);
Section faults_section(const RunFiles& run);
Section dipaco_section(const RunFiles& run);
Section pipeline_section(const RunFiles& run);

}  // namespace tributary::report
