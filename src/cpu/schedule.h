// How every CPU kernel cuts and runs its work: the one parallel entry point (the vector forward and its split-KV
// merge, the K/V gather, the AMX forward, the backward's sweeps, additive attention).
//   cut_length   how many pieces to cut keys or queries into so that there are enough work items for many
//                cores; the cut depends on the shape only (never on the thread count), so results are bitwise
//                identical on any machine size
//   team_size    the threads a run uses: at most the caller's count, no more than the work
//   run_team     one parallel region: each thread takes its own workspace (built by that thread, in its
//                allocator arena and first touched there; kept from an earlier call when the caller's
//                attn::Workspace holds one), then runs the loops in order, each loop's items spread over the team
//                and finished before the next loop starts. An allocation failure anywhere in the region (a
//                workspace, or inside an item) comes back as std::bad_alloc on the calling thread, which the
//                entry point turns into a Status; no exception ever leaves the region (that ends the process).
#pragma once

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <new>
#include <optional>
#include <type_traits>
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

// How a loop's items are shared out: `dynamic`, one at a time to whichever thread is free (items of uneven
// cost); `even`, in contiguous equal shares (items of equal cost, or a fixed order of merges); `ahead` (loop_ahead),
// one at a time as `dynamic`, but each thread claims its next item before it runs the current one, and the loop's
// function learns it, so an item can prefetch what its thread reads next (decode's blocks: the next block's first
// K/V rows, which its own tiles cannot reach in time). A thread claims ahead only while more items are unclaimed than
// the team has threads, so the last items still go to whichever thread is free first.
enum class Spread : unsigned char { dynamic, even, ahead };

// One loop of a run: fn(item, workspace) for items [0, items). With `wait` false the team does not wait for the
// loop to finish before the next one starts (the next must not read what this one writes).
// A Spread::ahead loop's function is fn(item, next, workspace), `next` the item the thread runs after this one
// (-1: none claimed yet).
template <class Fn>
struct Loop {
  std::int64_t items;
  Fn fn;
  Spread spread = Spread::dynamic;
  bool wait = true;
  mutable std::atomic<std::int64_t> claimed{0};  // Spread::ahead: items claimed so far, by any thread
};
template <class Fn>
Loop<Fn> loop(std::int64_t items, Fn fn, Spread spread = Spread::dynamic, bool wait = true) {
  return {items, fn, spread, wait};
}
template <class Fn>
Loop<Fn> loop_ahead(std::int64_t items, Fn fn) {
  return {items, fn, Spread::ahead, true};
}

// A thread's setup for a run, made on entry to the region and destroyed on exit (the AMX kernel's tile
// configuration and floating-point mode): constructed from the thread's workspace. NoScope does nothing.
struct NoScope {
  template <class WS>
  explicit NoScope(WS&) {}
};

// The workspace of a run whose threads need none (the K/V gather).
struct NoWorkspace {};

namespace detail {

template <class WS, class Fn>
void run_loop(const Loop<Fn>& l, WS& ws, int& failed) {
  const auto body = [&](auto... it) {
    try {
      l.fn(it..., ws);
    } catch (...) {
#pragma omp atomic write
      failed = 1;
    }
  };
  if constexpr (std::is_invocable_v<const Fn&, std::int64_t, std::int64_t, WS&>) {  // Spread::ahead
    const std::int64_t team = omp_get_num_threads();
    std::int64_t it = l.claimed.fetch_add(1, std::memory_order_relaxed);
    while (it < l.items) {
      std::int64_t next = -1;
      if (l.claimed.load(std::memory_order_relaxed) + team < l.items) next = l.claimed.fetch_add(1, std::memory_order_relaxed);
      body(it, next < l.items ? next : std::int64_t{-1});
      it = next >= 0 ? next : l.claimed.fetch_add(1, std::memory_order_relaxed);
    }
  } else if (l.spread == Spread::dynamic) {
#pragma omp for schedule(dynamic) nowait
    for (std::int64_t it = 0; it < l.items; ++it) body(it);
  } else {  // thread t of T takes items [t·n/T, (t+1)·n/T)
    const std::int64_t t = omp_get_thread_num(), team = omp_get_num_threads();
    for (std::int64_t it = l.items * t / team; it < l.items * (t + 1) / team; ++it) body(it);
  }
  if (l.wait) {
#pragma omp barrier
  }
}

}  // namespace detail

// Grows `team` to at least `n` workspaces (make(t) builds thread t's), keeping those it has (a workspace kept
// from an earlier call of the same dims is reused as it is). Each new workspace is built by the thread that
// will use it (in a parallel region of n threads, numbered as run_team numbers them): built by one thread, the
// team's buffers measured up to 10% slower at two threads.
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

// The one parallel entry point: a team of team_size(threads, most_items) threads, thread t with workspace
// (*team)[t] (grown with make as grow_team does), each running Scope(workspace) and then the loops in order.
// Returns the team size. Every exception inside the region becomes std::bad_alloc on the calling thread, after
// the region (the kernels throw nothing else: their sizes are checked before they run).
template <class Scope = NoScope, class WS, class Make, class... Fns>
int run_team(std::vector<WS>* team, int threads, std::int64_t most_items, Make make, const Loop<Fns>&... loops) {
  const int n = team_size(threads, most_items);
  grow_team(team, n, make);
  int failed = 0;
#pragma omp parallel num_threads(n) if (n > 1)
  {
    WS& ws = (*team)[static_cast<std::size_t>(omp_get_thread_num())];
    Scope scope(ws);
    (detail::run_loop(loops, ws, failed), ...);
  }
  if (failed) throw std::bad_alloc();
  return n;
}

// The same for loops whose threads need no workspace (their functions take a NoWorkspace&).
template <class... Fns>
void run_loops(int threads, std::int64_t most_items, const Loop<Fns>&... loops) {
  std::vector<NoWorkspace> team;
  run_team(&team, threads, most_items, [](int) { return NoWorkspace{}; }, loops...);
}

}  // namespace attn::cpu
