// The analysis as text for a terminal, and as JSON.
#include <sstream>

#include "capsule/format/json.h"
#include "capsule/ranks/internal/analysis.h"

namespace capsule {
namespace ranks {
namespace {

std::string Optional(bool has, uint64_t v) { return has ? std::to_string(v) : "-"; }

std::string Column(const std::string& s, size_t width) {
  return s.size() >= width ? s + "  " : s + std::string(width - s.size() + 2, ' ');
}

}  // namespace
}  // namespace ranks

using ranks::Column;
using ranks::Optional;

std::string RenderRunAnalysisText(const v1::RunTriage& t) {
  // Every string in `t` was escaped when it was made; Printable again costs nothing and keeps
  // this renderer safe for a message that came from elsewhere (a JSON file).
  std::ostringstream out;
  const auto runs = [&] {
    for (const auto& r : t.runs()) {
      out << "  run " << Printable(r.run_id()) << ": " << r.capsules() << " capsules\n";
    }
  };
  switch (t.outcome()) {
    case v1::TRIAGE_SEVERAL_RUNS:
      out << "capsules of " << t.runs_size() << " runs in " << Printable(t.dir())
          << "; pick one with --run ID:\n";
      runs();
      break;
    case v1::TRIAGE_NO_RUN:
      out << "no capsule of " << (t.run_id().empty() ? "a distributed run" : "that run") << " in "
          << Printable(t.dir()) << "\n";
      runs();
      break;
    default: {
      out << "run " << Printable(t.run_id()) << " in " << Printable(t.dir()) << ": world size "
          << t.world_size() << ", " << t.ranks_present_size() << " of " << t.world_size()
          << " ranks present, sequence base " << t.sequence_base() << "\n";
      if (t.missing_size() > 0) {
        std::vector<ranks::Range> missing;
        for (const v1::RankRange& r : t.missing()) missing.push_back({r.first(), r.last()});
        out << "  missing: " << ranks::RangeList(missing)
            << (t.missing_count() > 1 ? " (" + std::to_string(t.missing_count()) + " ranks)" : "")
            << "\n";
      }
      out << "\n"
          << Column("rank", 4) << Column("trigger", 16) << Column("step", 4) << Column("enq", 5)
          << Column("done", 5) << Column("last collective", 36) << Column("non-finite", 10)
          << Column("params", 16) << "position / error\n";
      for (const auto& e : t.ranks()) {
        std::string where = Printable(e.position());
        if (!e.error().empty()) where += (where.empty() ? "" : "; ") + Printable(e.error());
        out << Column(std::to_string(e.rank()), 4) << Column(Printable(e.trigger()), 16)
            << Column(std::to_string(e.last_step()), 4)
            << Column(Optional(e.has_last_enqueued(), e.last_enqueued()), 5)
            << Column(Optional(e.has_last_completed(), e.last_completed()), 5)
            << Column(Printable(e.last_collective()), 36)
            << Column(e.has_first_non_finite_step()
                          ? "step " + std::to_string(e.first_non_finite_step())
                          : "-",
                      10)
            << Column(e.params().empty() ? "-" : Printable(e.params()), 16)
            << (where.empty() ? "-" : where) << "\n";
      }
      out << "\n";
      if (t.findings_size() == 0) {
        out << (t.undecided_size() == 0 ? "no finding\n" : "no finding in the capsules present\n");
      }
      for (const auto& f : t.findings()) {
        out << Printable(f.check()) << ": " << Printable(f.detail()) << "\n";
      }
      for (const auto& u : t.undecided()) {
        out << Printable(u.check()) << ": " << Printable(u.reason()) << "\n";
      }
      if (!t.next_command().empty()) out << "next: " << Printable(t.next_command()) << "\n";
    }
  }
  for (const auto& u : t.unreadable()) {
    out << "unreadable (not used): " << Printable(u.capsule()) << ": " << Printable(u.reason())
        << "\n";
  }
  for (const auto& s : t.skipped()) {
    out << "skipped: " << Printable(s.capsule()) << ": " << Printable(s.reason()) << "\n";
  }
  return out.str();
}

std::string RenderRunAnalysisJson(const v1::RunTriage& triage) {
  return MessageToJson(triage) + "\n";
}

}  // namespace capsule
