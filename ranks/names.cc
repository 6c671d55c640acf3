// The names and ranges the analysis's sentences use, and what it keeps of a capsule.
#include <algorithm>

#include "capsule/ranks/internal/analysis.h"

namespace capsule::ranks {

std::string RankList(const std::vector<int>& ranks) {
  std::string out = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (i > 0) out += ", ";
    out += std::to_string(ranks[i]);
  }
  return out;
}

int64_t Count(const std::vector<Range>& ranges) {
  int64_t n = 0;
  for (const Range& r : ranges) n += int64_t{r.last} - r.first + 1;
  return n;
}

std::string RangeList(const std::vector<Range>& ranges) {
  constexpr size_t kShown = 8;
  const bool one = ranges.size() == 1 && ranges[0].first == ranges[0].last;
  std::string out = one ? "rank " : "ranks ";
  for (size_t i = 0; i < ranges.size() && i < kShown; ++i) {
    if (i > 0) out += ", ";
    out += std::to_string(ranges[i].first);
    if (ranges[i].last != ranges[i].first) out += ".." + std::to_string(ranges[i].last);
  }
  if (ranges.size() > kShown) {
    std::vector<Range> rest(ranges.begin() + kShown, ranges.end());
    out += " and " + std::to_string(Count(rest)) + " more";
  }
  return out;
}

void AddRanges(const std::vector<Range>& ranges,
               google::protobuf::RepeatedPtrField<v1::RankRange>* out) {
  for (const Range& r : ranges) {
    v1::RankRange& x = *out->Add();
    x.set_first(r.first);
    x.set_last(r.last);
  }
}

std::string Shapes(const google::protobuf::RepeatedPtrField<v1::CollectiveShape>& shapes) {
  std::string out;
  for (const auto& s : shapes) {
    out += "[";
    for (int i = 0; i < s.dims_size(); ++i) out += (i ? "," : "") + std::to_string(s.dims(i));
    out += "]";
  }
  return out;
}

CollectiveKey KeyOf(const v1::Collective& c) {
  return {c.op(),    c.tag(), c.dtype(), Shapes(c.in_shapes()), Shapes(c.out_shapes()),
          c.numel(), c.step()};
}

// "allreduce grads"
std::string OpTag(const v1::Collective& c) {
  return Field(c.op()) + (c.tag().empty() ? "" : " " + Field(c.tag()));
}

// "allreduce grads 1024 float32 [1024]"
std::string Described(const v1::Collective& c) {
  std::string out = OpTag(c) + " " + std::to_string(c.numel());
  if (!c.dtype().empty()) out += " " + Field(c.dtype());
  const std::string shapes = Shapes(c.in_shapes());
  if (!shapes.empty()) out += " " + Field(shapes);
  return out;
}

std::string Differing(const CollectiveKey& a, const CollectiveKey& b) {
  std::vector<std::string> what;
  if (a.op != b.op) what.push_back("op");
  if (a.tag != b.tag) what.push_back("tag");
  if (a.numel != b.numel) what.push_back("numel");
  if (a.dtype != b.dtype) what.push_back("dtype");
  if (a.in_shapes != b.in_shapes || a.out_shapes != b.out_shapes) what.push_back("shapes");
  if (a.step != b.step) what.push_back("step");
  std::string out;
  for (size_t i = 0; i < what.size(); ++i) out += (i ? ", " : "") + what[i];
  return out + (what.size() == 1 ? " differs" : " differ");
}

// What the analysis reads of a capsule: the rest (tensors, data, numerics) is dropped.
std::unique_ptr<v1::Capsule> KeptParts(const v1::Capsule& c) {
  auto k = std::make_unique<v1::Capsule>();
  *k->mutable_placement() = c.placement();
  k->mutable_step()->set_global_step(c.step().global_step());
  k->mutable_trigger()->set_kind(c.trigger().kind());
  k->mutable_trigger()->set_message(c.trigger().message());  // an EXCEPTION's what()
  k->set_created_unix_micros(c.created_unix_micros());
  if (c.has_objective()) *k->mutable_objective() = c.objective();
  if (c.has_distributed()) *k->mutable_distributed() = c.distributed();
  return k;
}

}  // namespace capsule::ranks
