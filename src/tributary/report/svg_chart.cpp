#include "tributary/report/svg_chart.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

namespace tributary::report {
namespace {

constexpr int kWidth = 900, kHeight = 300;
constexpr int kLeft = 70, kRight = 210, kTop = 30, kBottom = 45;  // the legend sits in the right margin
constexpr const char* kPalette[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd",
                                    "#8c564b", "#e377c2", "#17becf", "#7f7f7f", "#bcbd22"};

const char* colour(size_t i) { return kPalette[i % (sizeof(kPalette) / sizeof(kPalette[0]))]; }

struct Range {
  double lo = std::numeric_limits<double>::infinity(), hi = -std::numeric_limits<double>::infinity();
  bool counts = true;  // every value a whole number (workers, rounds, steps): no tick between two of them
  void add(double v) {
    if (!std::isfinite(v)) return;
    lo = std::min(lo, v);
    hi = std::max(hi, v);
    counts = counts && v == std::floor(v);
  }
  bool empty() const { return !(lo <= hi); }
};

// Tick positions at 1, 2 or 5 times a power of ten, about `n` of them; widens `r` to the outer ticks (and a range
// of one value to +-10%) so that the frame ends on a tick.
std::vector<double> ticks(Range& r, int n) {
  if (r.hi - r.lo < 1e-12 * std::max(1.0, std::abs(r.hi))) {  // one value: give it room
    const double pad = r.hi == 0 || r.counts ? 1.0 : std::abs(r.hi) * 0.1;
    r.lo -= pad;
    r.hi += pad;
  }
  const double raw = (r.hi - r.lo) / n, mag = std::pow(10.0, std::floor(std::log10(raw)));
  double step = raw / mag < 1.5 ? mag : raw / mag < 3.5 ? 2 * mag : raw / mag < 7.5 ? 5 * mag : 10 * mag;
  if (r.counts) step = std::max(step, 1.0);
  const Range given = r;
  r.lo = std::floor(r.lo / step) * step;
  r.hi = std::ceil(r.hi / step) * step;
  // Values near the largest double (a corrupt metrics line) round the frame to infinity: no ticks beyond the values.
  if (!std::isfinite(r.lo) || !std::isfinite(r.hi) || !(step > 0) || !std::isfinite(step)) {
    r = given;
    return {given.lo, given.hi};
  }
  std::vector<double> out;
  for (double t = r.lo; t <= r.hi + step * 1e-6 && out.size() <= size_t(4 * n); t += step)
    out.push_back(std::abs(t) < step * 1e-9 ? 0.0 : t);
  return out;
}

struct Frame {
  Range x, y;
  double sx(double v) const { return kLeft + (v - x.lo) / (x.hi - x.lo) * (kWidth - kLeft - kRight); }
  double sy(double v) const { return kHeight - kBottom - (v - y.lo) / (y.hi - y.lo) * (kHeight - kTop - kBottom); }
};

std::string open_svg(const Axes& axes) {
  return fmt::format(
      "<svg class=\"chart\" xmlns=\"http://www.w3.org/2000/svg\" viewBox=\"0 0 {0} {1}\" width=\"{0}\" height=\"{1}\" "
      "role=\"img\"><title>{2}</title><rect x=\"0\" y=\"0\" width=\"{0}\" height=\"{1}\" fill=\"#fff\"/>"
      "<text x=\"{3}\" y=\"18\" font-size=\"14\" font-weight=\"bold\">{2}</text>",
      kWidth, kHeight, html_escape(axes.title), kLeft);
}

std::string no_data(const Axes& axes) {
  return open_svg(axes) + fmt::format("<text x=\"{}\" y=\"{}\" font-size=\"13\" fill=\"#777\">no data</text></svg>",
                                      kWidth / 2 - 30, kHeight / 2);
}

// Grid, tick labels and axis labels of a frame whose ranges are final.
std::string axes_svg(const Frame& f, const std::vector<double>& xt, const std::vector<double>& yt, const Axes& axes) {
  std::string s;
  for (double t : yt)
    s += fmt::format(
        "<line x1=\"{0}\" x2=\"{1}\" y1=\"{2:.1f}\" y2=\"{2:.1f}\" stroke=\"#e5e5e5\"/>"
        "<text x=\"{3}\" y=\"{4:.1f}\" font-size=\"11\" text-anchor=\"end\">{5}</text>",
        kLeft, kWidth - kRight, f.sy(t), kLeft - 6, f.sy(t) + 4, short_number(t));
  for (double t : xt)
    s += fmt::format("<text x=\"{:.1f}\" y=\"{}\" font-size=\"11\" text-anchor=\"middle\">{}</text>", f.sx(t),
                     kHeight - kBottom + 16, short_number(t));
  s += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"none\" stroke=\"#999\"/>", kLeft, kTop,
                   kWidth - kLeft - kRight, kHeight - kTop - kBottom);
  s += fmt::format("<text x=\"{}\" y=\"{}\" font-size=\"12\" text-anchor=\"middle\">{}</text>",
                   (kLeft + kWidth - kRight) / 2, kHeight - 8, html_escape(axes.x_label));
  s += fmt::format(
      "<text x=\"14\" y=\"{0}\" font-size=\"12\" text-anchor=\"middle\" "
      "transform=\"rotate(-90 14 {0})\">{1}</text>",
      (kTop + kHeight - kBottom) / 2, html_escape(axes.y_label));
  return s;
}

std::string legend(const std::vector<std::string>& names) {
  std::string s;
  for (size_t i = 0; i < names.size() && i < 16; ++i) {
    const int y = kTop + 8 + int(i) * 16;
    s += fmt::format(
        "<rect x=\"{}\" y=\"{}\" width=\"12\" height=\"8\" fill=\"{}\"/>"
        "<text x=\"{}\" y=\"{}\" font-size=\"11\">{}</text>",
        kWidth - kRight + 10, y - 7, colour(i), kWidth - kRight + 26, y, html_escape(names[i]));
  }
  if (names.size() > 16)
    s += fmt::format("<text x=\"{}\" y=\"{}\" font-size=\"11\">+{} more</text>", kWidth - kRight + 10,
                     kTop + 8 + 16 * 16, names.size() - 16);
  return s;
}

}  // namespace

std::string html_escape(const std::string& text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string short_number(double v) {
  if (!std::isfinite(v)) return "-";
  const double a = std::abs(v);
  if (a >= 1e9) return fmt::format("{:.3g} G", v / 1e9);
  if (a >= 1e6) return fmt::format("{:.3g} M", v / 1e6);
  if (a >= 1e4) return fmt::format("{:.3g} k", v / 1e3);
  return fmt::format("{:.4g}", v);
}

std::string line_chart(const std::vector<Series>& series, const Axes& axes) {
  Frame f;
  for (const auto& s : series)
    for (const auto& [x, y] : s.points)
      if (std::isfinite(x) && std::isfinite(y)) {
        f.x.add(x);
        f.y.add(y);
      }
  if (f.x.empty()) return no_data(axes);
  const auto xt = ticks(f.x, 6), yt = ticks(f.y, 5);
  std::string s = open_svg(axes) + axes_svg(f, xt, yt, axes);
  std::vector<std::string> names;
  for (size_t i = 0; i < series.size(); ++i) {
    names.push_back(series[i].name);
    std::string path;
    for (const auto& [x, y] : series[i].points) {
      if (!std::isfinite(x) || !std::isfinite(y)) continue;
      path += fmt::format("{}{:.1f},{:.1f}", path.empty() ? "M" : " L", f.sx(x), f.sy(y));
      if (series[i].markers)
        s += fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"3\" fill=\"{}\"/>", f.sx(x), f.sy(y), colour(i));
    }
    if (!path.empty())
      s += fmt::format("<path d=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"1.6\"/>", path, colour(i));
  }
  return s + legend(names) + "</svg>";
}

std::string bar_chart(const std::vector<Bar>& bars, const std::vector<std::string>& part_names, const Axes& axes) {
  Frame f;
  f.x = {0, double(bars.size())};
  f.y.add(0);
  for (const auto& b : bars) {
    double total = 0;
    for (double p : b.parts) total += std::isfinite(p) ? p : 0;
    f.y.add(total);
  }
  if (bars.empty()) return no_data(axes);
  const auto yt = ticks(f.y, 5);
  std::string s = open_svg(axes) + axes_svg(f, {}, yt, axes);
  const double slot = (kWidth - kLeft - kRight) / double(bars.size()), width = std::max(1.0, slot * 0.7);
  const size_t label_every = std::max<size_t>(1, bars.size() / 12);
  for (size_t i = 0; i < bars.size(); ++i) {
    double base = 0;
    const double x = kLeft + slot * double(i) + (slot - width) / 2;
    for (size_t p = 0; p < bars[i].parts.size(); ++p) {
      const double v = std::isfinite(bars[i].parts[p]) ? bars[i].parts[p] : 0;
      s += fmt::format(
          "<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" fill=\"{}\">"
          "<title>{}: {}</title></rect>",
          x, f.sy(base + v), width, f.sy(base) - f.sy(base + v), colour(p), html_escape(bars[i].label),
          short_number(v));
      base += v;
    }
    if (i % label_every == 0)
      s += fmt::format("<text x=\"{:.1f}\" y=\"{}\" font-size=\"11\" text-anchor=\"middle\">{}</text>", x + width / 2,
                       kHeight - kBottom + 16, html_escape(bars[i].label));
  }
  return s + legend(part_names) + "</svg>";
}

std::string timeline(const std::vector<std::string>& rows, const std::vector<Span>& spans,
                     const std::vector<std::string>& kind_names, const Axes& axes) {
  Frame f;
  for (const auto& sp : spans) {
    f.x.add(sp.begin);
    f.x.add(sp.end);
  }
  if (f.x.empty() || rows.empty()) return no_data(axes);
  f.x.lo = std::min(f.x.lo, 0.0);
  const auto xt = ticks(f.x, 6);
  f.y = {0, double(rows.size())};
  std::string s = open_svg(axes) + axes_svg(f, xt, {}, axes);
  const double band = (kHeight - kTop - kBottom) / double(rows.size());
  for (size_t r = 0; r < rows.size(); ++r)
    s += fmt::format("<text x=\"{}\" y=\"{:.1f}\" font-size=\"11\" text-anchor=\"end\">{}</text>", kLeft - 6,
                     kTop + band * (double(r) + 0.5) + 4, html_escape(rows[r]));
  for (const auto& sp : spans) {
    if (sp.row >= rows.size() || !(sp.end > sp.begin)) continue;
    s += fmt::format(
        "<rect x=\"{:.2f}\" y=\"{:.1f}\" width=\"{:.2f}\" height=\"{:.1f}\" fill=\"{}\">"
        "<title>{} {}: {:.2f}-{:.2f} s</title></rect>",
        f.sx(sp.begin), kTop + band * double(sp.row) + band * 0.15, f.sx(sp.end) - f.sx(sp.begin), band * 0.7,
        colour(sp.kind), html_escape(rows[sp.row]), html_escape(sp.kind < kind_names.size() ? kind_names[sp.kind] : ""),
        sp.begin, sp.end);
  }
  return s + legend(kind_names) + "</svg>";
}

}  // namespace tributary::report
