// How every CPU kernel cuts and runs its work (one scheduler for the forward, the AMX forward and the backward).
//   cut_length   how many pieces to cut a length into so that there are enough work items for many cores; the
//                cut depends on the shape only (never on the thread count), so results are bitwise identical
//                on any machine size
//   team_size,   one workspace per thread, each built by its own thread before the work starts: an allocation
//   grow_team    failure becomes a std::bad_alloc on the calling thread, which the entry point turns into a
//                Status, never an exception leaving a parallel region (which ends the process); the team is no
//                larger than the work; workspaces a caller's attn::Workspace kept from an earlier call are reused
//   run_items    items [0, n) over the team, dynamically scheduled, each thread with its own workspace
#pragma once

#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <new>
#include <optional>
#include <vector>

namespace attn::cpu {

struct Cut {
  std::int64_t pieces = 1, piece_len = 0;
};

// Cuts `length` into pieces so that items · pieces reaches `target` where it can, each piece at least
// `min_piece` long (and at most `max_piece`, when > 0) and a multiple of `grain`; one piece when `items` alone
// reach the target or the length is short.
inline Cut cut_length(std::int64_t items, std::int64_t length, std::int64_t target, std::int64_t min_piece,
                      std::int64_t grain, std::int64_t max_piece = 0) {
  Cut c;
  items = std::max<std::int64_t>(items, 1);
  std::int64_t pieces = 1;
  if (items < target && length >= 2 * min_piece) pieces = std::min((target + items - 1) / items, length / min_piece);
  if (max_piece > 0) pieces = std::max(pieces, (length + max_piece - 1) / max_piece);
  c.piece_len = std::max<std::int64_t>(((length + pieces - 1) / pieces + grain - 1) / grain * grain, grain);
  c.pieces = std::max<std::int64_t>((length + c.piece_len - 1) / c.piece_len, 1);
  return c;
}

// The team for `tasks` tasks: at most `threads` threads, no more than the work.
inline int team_size(int threads, std::int64_t tasks) {
  return static_cast<int>(std::clamp<std::int64_t>(tasks, 1, std::max(threads, 1)));
}

// Grows `team` to at least `n` workspaces (make(t) builds thread t's), keeping those it has (a workspace kept
// from an earlier call of the same dims is reused as it is). Each new workspace is built by the thread that
// will use it (in a parallel region of n threads, as run_items numbers them): its memory comes from that
// thread's allocator arena and is first touched there, as when each thread allocated its own (built by one
// thread, the team's buffers measured up to 10% slower at two threads). An allocation failure is caught inside
// the region and rethrown here, on the calling thread, as std::bad_alloc (an exception must not leave a
// parallel region: that ends the process).
template <class WS, class Make>
void grow_team(std::vector<WS>* team, int n, Make make) {
  const int have = static_cast<int>(team->size());
  if (have >= n) return;
  team->reserve(static_cast<std::size_t>(n));
  std::vector<std::optional<WS>> made(static_cast<std::size_t>(n - have));
  int failed = 0;
#pragma omp parallel num_threads(n) if (n > 1)
  {
    const int t = omp_get_thread_num();
    if (t >= have) {
      try {
        made[static_cast<std::size_t>(t - have)].emplace(make(t));
      } catch (...) {
#pragma omp atomic write
        failed = 1;
      }
    }
  }
  if (failed) throw std::bad_alloc();
  // OpenMP may give the region fewer threads than asked (a call from inside the caller's own parallel region,
  // OMP_DYNAMIC, thread limits): the workspaces no thread built are built here.
  for (std::size_t i = 0; i < made.size(); ++i) {
    if (!made[i]) made[i].emplace(make(have + static_cast<int>(i)));
    team->push_back(std::move(*made[i]));
  }
}

// fn(item, workspace) for items [0, items), dynamically scheduled over the first n workspaces of the team.
template <class WS, class Fn>
void run_items(std::vector<WS>& team, int n, std::int64_t items, Fn fn) {
#pragma omp parallel num_threads(n) if (n > 1)
  {
    WS& ws = team[static_cast<std::size_t>(omp_get_thread_num())];
#pragma omp for schedule(dynamic)
    for (std::int64_t it = 0; it < items; ++it) fn(it, ws);
  }
}

}  // namespace attn::cpu
