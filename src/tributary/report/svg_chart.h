// The run report's charts as inline SVG: the page must open with no network and no script library, so the charts
// are drawn here, not by a JavaScript plotting package. Three shapes cover every section: lines (curves over tokens,
// time or steps), stacked bars (per outer step), and a timeline (per worker: computing vs blocked, along the clock).
// Output is deterministic text; every chart carries class="chart" and a <title> for the page's own check.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace tributary::report {

struct Axes {
  std::string title;
  std::string x_label;
  std::string y_label;
};

struct Series {
  std::string name;
  std::vector<std::pair<double, double>> points;  // (x, y); non-finite points are left out
  bool markers = false;                           // draw each point (sparse series: evaluations)
};

// Lines in a fixed palette with a legend; an empty or pointless chart says "no data" in its frame.
std::string line_chart(const std::vector<Series>& series, const Axes& axes);

struct Bar {
  std::string label;          // under the bar (thinned when there are many)
  std::vector<double> parts;  // stacked, bottom first, one per part name
};
std::string bar_chart(const std::vector<Bar>& bars, const std::vector<std::string>& part_names, const Axes& axes);

struct Span {
  size_t row = 0;             // index into the row names
  double begin = 0, end = 0;  // x (seconds)
  size_t kind = 0;            // index into the kind names (colour)
};
std::string timeline(const std::vector<std::string>& rows, const std::vector<Span>& spans,
                     const std::vector<std::string>& kind_names, const Axes& axes);

std::string html_escape(const std::string& text);
// "1.23 M", "456 k", "0.012": short numbers for ticks and tables.
std::string short_number(double value);

}  // namespace tributary::report
