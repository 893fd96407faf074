// Everything the kernel bodies (cpu/flash_kernel.h, cpu/backward_kernel.h, cpu/vec.h) use, included by each
// instruction-set unit before its `#pragma GCC target` region. The bodies include nothing themselves: a header
// first included inside the region would have its inline functions compiled for that instruction set, and the
// linker may keep that copy for the whole program (an illegal instruction on a machine without it). The test
// isa.objects_stay_in_their_namespace (scripts/check_isa_objects.py) checks every unit's object for this.
#pragma once
#define ATTN_ISA_PRELUDE 1

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <new>
#include <optional>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/backward_problem.h"
#include "core/convert.h"
#include "core/mask.h"
#include "core/online_softmax.h"
#include "core/problem.h"
#include "core/workspace_impl.h"
#include "cpu/aligned.h"
#include "cpu/kernels.h"
#include "cpu/pick.h"
#include "cpu/prefetch_tuner.h"
#include "cpu/schedule.h"
