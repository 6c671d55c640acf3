// The collective rings of the ranks, aligned by sequence number: a mismatched or skipped
// collective, a rank that never issued one, a rank that raised, a dead peer.
#include <algorithm>
#include <limits>

#include "capsule/base/internal/strings.h"
#include "capsule/ranks/internal/analysis.h"

namespace capsule::ranks {
namespace {

// How the reference side of a mismatch was chosen when no side is a majority: by the ranks'
// own history of that call, or (nothing telling the sides apart) by the lowest rank. Empty when
// the reference side is a majority.
template <typename Groups, typename Score>
std::string TieBreak(const Groups& groups, const CollectiveKey& best, const Score& score) {
  const auto& ref = groups.at(best);
  std::vector<int> tied;
  bool history = false;
  for (const auto& [key, ranks] : groups) {
    if (key == best || ranks.size() != ref.size()) continue;
    tied.insert(tied.end(), ranks.begin(), ranks.end());
    history |= std::get<1>(score(ref)) && !std::get<1>(score(ranks));
  }
  if (tied.empty()) return "";
  std::sort(tied.begin(), tied.end());
  if (history) {
    return "; no majority: " + RankList(ref) + " made this call as in its earlier steps and " +
           RankList(tied) + " did not";
  }
  return "; no majority, and nothing tells the sides apart: " + RankList(ref) +
         " is taken as the reference as the lowest rank; either side may be the odd one";
}

}  // namespace

void Analysis::Hang() {
  uint64_t lo = 0, hi = 0;
  bool any = false;
  for (const auto& [rank, v] : views_) {
    if (v.collectives.empty()) continue;
    lo = any ? std::max(lo, v.collectives.begin()->first) : v.collectives.begin()->first;
    hi = any ? std::max(hi, v.collectives.rbegin()->first) : v.collectives.rbegin()->first;
    any = true;
  }
  if (!any) {
    PointToPoint();
    if (!hang_found_ && !missing_.empty()) Undecided("hang", NoCapsuleFrom(missing_));
    return;
  }
  // The sequences some rank recorded in [lo, hi]: the loops below visit these, never every
  // number in between (ranks may record sequences far apart).
  std::set<uint64_t> seqs;
  for (const auto& [rank, v] : views_) {
    for (auto it = v.collectives.lower_bound(lo); it != v.collectives.end() && it->first <= hi;
         ++it) {
      seqs.insert(it->first);
    }
  }
  std::set<int> named;
  Mismatch(seqs, &named);
  Behind(hi, named);
  named_.insert(named.begin(), named.end());
  DeadPeer(seqs);
  PointToPoint();
  if (!hang_found_ && !missing_.empty()) Undecided("hang", NoCapsuleFrom(missing_));
}

const v1::Collective* Analysis::At(const RankView& v, uint64_t seq) const {
  auto it = v.collectives.find(seq);
  return it == v.collectives.end() ? nullptr : it->second;
}

// Whether rank `v`'s entries of `c`'s tag before `seq` were all like `c`: a rank whose entry
// changed from its own history is the odd one when the count does not say.
bool Analysis::LikeItsHistory(const RankView& v, const v1::Collective& c, uint64_t seq) const {
  for (auto it = v.collectives.begin(); it != v.collectives.end() && it->first < seq; ++it) {
    if (it->second->tag() == c.tag() && it->second->op() == c.op() &&
        !KeyOf(*it->second).SameCall(KeyOf(c))) {
      return false;
    }
  }
  return true;
}

// Whether, in rank `w`'s entries before `seq`, a call like `first` is followed within one step
// by a call like `then`: the order the rank's loop issues its collectives in.
bool Analysis::FollowsInStep(const RankView& w, const v1::Collective& first,
                             const v1::Collective& then, uint64_t seq) const {
  const CollectiveKey a = KeyOf(first), b = KeyOf(then);
  const v1::Collective* prev = nullptr;
  for (auto it = w.collectives.begin(); it != w.collectives.end() && it->first < seq; ++it) {
    const v1::Collective* c = it->second;
    if (prev != nullptr && prev->sequence() + 1 == c->sequence() && prev->step() == c->step() &&
        KeyOf(*prev).SameCall(a) && KeyOf(*c).SameCall(b)) {
      return true;
    }
    prev = c;
  }
  return false;
}

namespace {
// The Monitor's own trigger agreement, issued as a collective of its own (capture/distributed.h).
bool IsOwnAgreement(const v1::Collective& c) {
  return c.op() == "allreduce" && c.tag() == "capsule.agree";
}
}  // namespace

// (a) The first sequence whose entries differ between the ranks.
void Analysis::Mismatch(const std::set<uint64_t>& seqs, std::set<int>* named) {
  for (uint64_t s : seqs) {
    std::map<CollectiveKey, std::vector<int>> groups;
    for (const auto& [rank, v] : views_) {
      if (const v1::Collective* c = At(v, s)) groups[KeyOf(*c)].push_back(rank);
    }
    if (groups.size() < 2) continue;
    // A rank skipped s when its entry at s is the others' entry at s+1, issued in the same step;
    // or, when the others could not go on to s+1 (a backend that fails the mismatched call),
    // when its entry at s is the call the others always make right after theirs at s within a
    // step (and not the other way round).
    std::vector<int> skipped;
    std::map<int, bool> by_history, by_carry;
    for (const auto& [rank, v] : views_) {
      const v1::Collective* mine = At(v, s);
      if (mine == nullptr) continue;
      int agree = 0, differ = 0, follows = 0, other_way = 0, carried = 0;
      for (const auto& [other, w] : views_) {
        if (other == rank) continue;
        const v1::Collective* here = At(w, s);
        if (here == nullptr || KeyOf(*here) == KeyOf(*mine)) continue;
        // Its own agreement where the others' reduction carried theirs: it never reduced.
        if (IsOwnAgreement(*mine) && here->carries_agreement()) {
          ++carried;
          continue;
        }
        if (FollowsInStep(w, *here, *mine, s)) ++follows;
        if (FollowsInStep(v, *mine, *here, s)) ++other_way;
        const v1::Collective* next =
            s == std::numeric_limits<uint64_t>::max() ? nullptr : At(w, s + 1);
        if (next == nullptr) continue;
        (KeyOf(*next) == KeyOf(*mine) ? agree : differ)++;
      }
      if (carried > 0 && agree == 0 && differ == 0) {
        skipped.push_back(rank);
        by_carry[rank] = true;
      } else if (agree > 0 && differ == 0) {
        skipped.push_back(rank);
      } else if (agree == 0 && differ == 0 && follows > 0 && other_way == 0) {
        skipped.push_back(rank);
        by_history[rank] = true;
      }
    }
    if (!skipped.empty() && skipped.size() < views_.size()) {
      for (int rank : skipped) {
        const RankView& v = views_.at(rank);
        const v1::Collective* theirs = nullptr;
        for (const auto& [other, w] : views_) {
          if (!std::count(skipped.begin(), skipped.end(), other) && At(w, s)) theirs = At(w, s);
        }
        const std::string how =
            by_carry[rank]
                ? "its sequence " + std::to_string(s) + " is the step's own agreement (" +
                      OpTag(*At(v, s)) + "), which the others' " + OpTag(*theirs) + " carried"
            : by_history[rank] ? "its sequence " + std::to_string(s) + " (" + OpTag(*At(v, s)) +
                                     ") is the call the others make right after " + OpTag(*theirs) +
                                     " in every step"
                               : "its sequence " + std::to_string(s) + " is the others' " +
                                     std::to_string(s + 1) + " (" + OpTag(*At(v, s)) + ")";
        Add("hang.skipped_collective",
            "rank " + std::to_string(rank) + " skipped collective " + std::to_string(s) + " (" +
                OpTag(*theirs) + ", step " + std::to_string(theirs->step()) + "): " + how,
            {rank}, v.PathFor(theirs->step()))
            .step(theirs->step(), s);
        named->insert(rank);
      }
      hang_found_ = true;
      return;
    }
    // The majority's entry is the reference; a tie goes to the group whose ranks' entries are
    // like their own history, then to the group of the lowest rank.
    auto score = [&](const std::vector<int>& ranks) {
      bool like = true;
      for (int r : ranks) like &= LikeItsHistory(views_.at(r), *At(views_.at(r), s), s);
      return std::make_tuple(ranks.size(), like, -ranks.front());
    };
    auto best = groups.begin();
    for (auto it = groups.begin(); it != groups.end(); ++it) {
      if (score(it->second) > score(best->second)) best = it;
    }
    const std::vector<int>& ref = best->second;
    const v1::Collective& theirs = *At(views_.at(ref.front()), s);
    const std::string tie = TieBreak(groups, best->first, score);
    for (const auto& [key, ranks] : groups) {
      if (&ranks == &ref) continue;
      const v1::Collective& mine = *At(views_.at(ranks.front()), s);
      if (mine.step() + 1 == theirs.step()) {
        // A step behind, and in another call: its loop ended a step early and it went on to
        // what comes after training (a final barrier, a checkpoint) while the others train.
        for (int rank : ranks) {
          const RankView& v = views_.at(rank);
          std::string detail = "rank " + std::to_string(rank) +
                               "'s data ran out one step early (uneven data): it began step " +
                               std::to_string(v.last_step) + " last, the others step " +
                               std::to_string(theirs.step()) + "; at sequence " +
                               std::to_string(s) + " it called " + Described(mine) +
                               " where the others called " + Described(theirs);
          const std::string position = Position(v);
          if (!position.empty()) detail += "; its trainer thread: " + position;
          Add("hang.uneven_data", detail, {rank}, v.latest_path()).step(theirs.step(), s);
        }
        named->insert(ranks.begin(), ranks.end());
        continue;
      }
      Add("hang.mismatch",
          "mismatch at sequence " + std::to_string(s) + ": " + RankList(ranks) + " " +
              Described(mine) + " vs " +
              (ref.size() + ranks.size() == views_.size() ? std::string("others") : RankList(ref)) +
              " " + Described(theirs) + " (" + Differing(key, best->first) + ")" + tie,
          ranks, views_.at(ranks.front()).PathFor(mine.step()))
          .step(mine.step(), s);
      named->insert(ranks.begin(), ranks.end());
    }
    hang_found_ = true;
    return;
  }
}

// (b) Ranks whose last collective is behind a sequence the others issued and could not finish.
void Analysis::Behind(uint64_t hi, const std::set<int>& named) {
  int64_t last_step = 0;
  for (const auto& [rank, v] : views_) last_step = std::max(last_step, v.last_step);
  for (const auto& [rank, v] : views_) {
    if (named.count(rank) || v.collectives.empty()) continue;
    if (v.collectives.rbegin()->first >= hi) continue;
    const uint64_t s = v.collectives.rbegin()->first + 1;
    // Others that completed s had this rank with them (its capsule is only older); ranks
    // waiting in s are waiting for it.
    std::vector<int> waiting;
    const v1::Collective* theirs = nullptr;
    bool completed = false;
    for (const auto& [other, w] : views_) {
      const v1::Collective* c = At(w, s);
      if (other == rank || c == nullptr) continue;
      completed |= c->state() == v1::COMPLETED;
      waiting.push_back(other);
      theirs = c;
    }
    if (completed || theirs == nullptr) continue;
    hang_found_ = true;
    const std::string issued = "never issued sequence " + std::to_string(s) + " (" +
                               OpTag(*theirs) + ", step " + std::to_string(theirs->step()) +
                               ") that " + RankList(waiting) +
                               (waiting.size() == 1 ? " waits" : " wait") + " in";
    const auto [check, detail] = WhyBehind(v, s, last_step, issued);
    Add(check, detail, {rank}, v.latest_path()).step(theirs->step(), s);
    named_.insert(rank);
  }
}

std::pair<std::string, std::string> Analysis::WhyBehind(const RankView& v, uint64_t s,
                                                        int64_t last_step,
                                                        const std::string& issued) const {
  const std::string rank = "rank " + std::to_string(v.rank);
  const int64_t behind = last_step - v.last_step;
  const std::string position = Position(v);
  const std::string where = position.empty() ? "" : "; its trainer thread: " + position;
  if (v.latest().trigger().kind() == v1::EXCEPTION) {
    // Its step threw and the trainer left the loop: the others wait for a rank that is gone.
    return {"hang.exception", rank + " raised an exception in step " +
                                  std::to_string(v.latest().step().global_step()) +
                                  " and left the run (" + ExceptionText(v) + "); it " + issued +
                                  where};
  }
  if (auto f = finished_.find(v.rank); f != finished_.end() && f->second < last_step) {
    return {"hang.uneven_data", UnevenData(v.rank, f->second, last_step) + "; it " + issued};
  }
  if (const v1::Collective* p = PendingP2p(v)) {
    return {"hang.point_to_point",
            rank + " waits in " + P2pText(*p) + " and " + issued + P2pPeerSays(v.rank, *p) + where};
  }
  if (v.collectives.rbegin()->second->state() == v1::COMPLETED) {
    // Its last call completed and it issued nothing since: it is not waiting in a recorded
    // collective but elsewhere (data loading, I/O, its own deadlock, or a collective issued on
    // the group directly, which the wrapper cannot see).
    return {"hang.stuck_rank",
            rank + " is stuck outside the recorded collectives: its last one (sequence " +
                std::to_string(s - 1) + ") completed, and it " + issued +
                " (data loading, I/O, its own deadlock, or a collective issued on the process "
                "group directly)" +
                where};
  }
  if (behind == 1) {
    return {"hang.uneven_data", rank +
                                    "'s data ran out one step early (uneven data): it began step " +
                                    std::to_string(v.last_step) + " last, the others step " +
                                    std::to_string(last_step) + ", and " + issued + where};
  }
  std::string detail = rank + " " + issued;
  if (behind > 1) detail += "; it is " + std::to_string(behind) + " steps behind";
  return {"hang.never_issued", detail + where};
}

// "rank 2 finished its training loop after step 5 while the others went on to step 6: its data
// ran out early (uneven data)"
std::string Analysis::UnevenData(int rank, int64_t its_last, int64_t others_last) const {
  return "rank " + std::to_string(rank) + " finished its training loop after step " +
         std::to_string(its_last) + " while the others went on to step " +
         std::to_string(others_last) + " (the step numbers its capsule or the store recorded): " +
         "its data ran out early (uneven data)";
}

const v1::Collective* Analysis::PendingP2p(const RankView& v) const {
  const v1::Collective* last = nullptr;
  for (const auto& [key, c] : v.p2p) {
    if (c->state() == v1::COMPLETED) continue;
    if (last == nullptr || c->enqueued_unix_micros() > last->enqueued_unix_micros()) last = c;
  }
  return last;
}

// "recv act from rank 0 (#3, step 2)"
std::string Analysis::P2pText(const v1::Collective& c) {
  return Field(c.op()) + (c.tag().empty() ? "" : " " + Field(c.tag())) +
         (c.op() == "send" ? " to rank " : " from rank ") + std::to_string(c.peer()) + " (#" +
         std::to_string(c.sequence()) + ", step " + std::to_string(c.step()) + ")";
}

// What the peer's ring says of the op matching `c` (rank `rank`'s n-th recv from the peer is the
// peer's n-th send to it): "; rank 0 never issued its send to rank 1 #3 (its last is #2)".
std::string Analysis::P2pPeerSays(int rank, const v1::Collective& c) const {
  auto it = views_.find(c.peer());
  if (it == views_.end()) return "; " + NoCapsuleFrom({{c.peer(), c.peer()}});
  const std::string match = c.op() == "send" ? "recv" : "send";
  const RankView& peer = it->second;
  if (peer.p2p.count({rank, match, c.sequence()})) {
    return "; rank " + std::to_string(c.peer()) + " issued the matching " + match + " #" +
           std::to_string(c.sequence());
  }
  std::string last = "none";
  for (const auto& [key, k] : peer.p2p) {
    if (std::get<0>(key) == rank && std::get<1>(key) == match)
      last = "#" + std::to_string(std::get<2>(key));
  }
  return "; rank " + std::to_string(c.peer()) + " never issued the matching " + match + " #" +
         std::to_string(c.sequence()) + " (its last " + match +
         (match == "send" ? " to" : " from") + " rank " + std::to_string(rank) + ": " + last + ")";
}

// A rank waiting in a point-to-point op whose match its peer never issued, when the collective
// rings named nobody.
void Analysis::PointToPoint() {
  if (hang_found_) return;
  for (const auto& [rank, v] : views_) {
    const v1::Collective* p = PendingP2p(v);
    if (p == nullptr) continue;
    const std::string peer = P2pPeerSays(rank, *p);
    if (peer.find("never issued") == std::string::npos) continue;
    Add("hang.point_to_point", "rank " + std::to_string(rank) + " waits in " + P2pText(*p) + peer,
        {p->peer()}, v.latest_path())
        .step(p->step());
    named_.insert(p->peer());
    hang_found_ = true;
    return;
  }
}

std::string Analysis::ExceptionText(const RankView& v) {
  const std::string& what = v.latest().trigger().message();
  return what.empty() ? std::string("no text recorded") : "\"" + Field(what) + "\"";
}

// A rank whose step threw, when no other finding named it: the exception is evidence in itself.
void Analysis::Exceptions() {
  for (const auto& [rank, v] : views_) {
    if (named_.count(rank) || v.latest().trigger().kind() != v1::EXCEPTION) continue;
    if (auto role = roles_.find(rank); role != roles_.end() && role->second == "victim") continue;
    const int64_t step = v.latest().step().global_step();
    Add("rank.exception",
        "rank " + std::to_string(rank) + "'s step " + std::to_string(step) +
            " raised an exception (" + ExceptionText(v) + ")",
        {rank}, v.latest_path())
        .step(step);
  }
}

// (c) Every present rank enqueued s and none completed it, while a rank wrote no capsule.
void Analysis::DeadPeer(const std::set<uint64_t>& seqs) {
  if (missing_.empty() || hang_found_) return;
  if (FinishedPeers(seqs)) return;
  for (uint64_t s : seqs) {
    bool all = true, none_completed = true;
    const v1::Collective* c = nullptr;
    for (const auto& [rank, v] : views_) {
      const v1::Collective* mine = At(v, s);
      all &= mine != nullptr;
      if (mine == nullptr) break;
      none_completed &= mine->state() != v1::COMPLETED;
      c = mine;
    }
    if (!all || !none_completed) continue;
    std::string detail = "every present rank (" + RankList(present_) + ") enqueued sequence " +
                         std::to_string(s) + " (" + OpTag(*c) + ", step " +
                         std::to_string(c->step()) + ") and none completed it; " +
                         RangeList(missing_) + " wrote no capsule: a dead or hung peer";
    std::set<int> reported;
    for (const auto& [rank, v] : views_) {
      for (int m : v.latest().distributed().agreement().missing_ranks()) reported.insert(m);
    }
    if (!reported.empty()) {
      detail += "; the trigger agreement also missed " +
                RankList(std::vector<int>(reported.begin(), reported.end()));
    }
    for (const auto& [rank, v] : views_) {
      const v1::Collective* mine = At(v, s);
      if (mine->state() == v1::FAILED && !mine->error().empty()) {
        detail += "; rank " + std::to_string(rank) + ": " + Field(mine->error());
        break;
      }
    }
    Add("hang.dead_peer", detail, {}, views_.begin()->second.latest_path())
        .step(c->step(), s)
        .missing(missing_);
    hang_found_ = true;
    return;
  }
}

std::string Analysis::Position(const RankView& v) {
  for (const auto& t : v.latest().distributed().threads()) {
    if (t.thread() == "trainer") {
      return Field(t.position()) + " for " + FormatSignificant(t.seconds(), 3) + " s";
    }
  }
  return "";
}

// Missing ranks that the store said finished their loop before the step the others went on to:
// uneven data, not a dead peer.
bool Analysis::FinishedPeers(const std::set<uint64_t>& seqs) {
  int64_t last_step = 0;
  for (const auto& [rank, v] : views_) last_step = std::max(last_step, v.last_step);
  std::vector<int> early;
  for (const auto& [r, step] : finished_) {
    if (!views_.count(r) && step < last_step) early.push_back(r);
  }
  if (early.empty()) return false;
  const v1::Collective* waited = nullptr;
  for (uint64_t s : seqs) {
    bool any = false, none_completed = true;
    const v1::Collective* c = nullptr;
    for (const auto& [rank, v] : views_) {
      if (const v1::Collective* mine = At(v, s)) {
        any = true;
        none_completed &= mine->state() != v1::COMPLETED;
        c = mine;
      }
    }
    if (any && none_completed) {
      waited = c;
      break;
    }
  }
  for (int r : early) {
    std::string detail = UnevenData(r, finished_.at(r), last_step) + "; it wrote no capsule";
    if (waited != nullptr) {
      detail += ", and " + RankList(present_) + (present_.size() == 1 ? " waits" : " wait") +
                " in sequence " + std::to_string(waited->sequence()) + " (" + OpTag(*waited) +
                ", step " + std::to_string(waited->step()) + ")";
    }
    FindingRef f = Add("hang.uneven_data", detail, {r}, views_.begin()->second.latest_path());
    f.missing({{r, r}});
    if (waited != nullptr) f.step(waited->step(), waited->sequence());
    named_.insert(r);
  }
  hang_found_ = true;
  return true;
}

}  // namespace capsule::ranks
