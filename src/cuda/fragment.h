// Register-fragment layouts of the two warp-level instructions the tensor-core kernels are built on, written
// from the tables of NVIDIA's PTX ISA (version 9.0; section numbers as there):
//
//   mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}.{bf16,f16}.f32  d, a, b, c
//     9.7.14.5.8 "Matrix Fragments for mma.m16n8k16 with floating point type": A is 16x16 (row-major
//     operand), B 16x8 (column-major operand), C and D 16x8 fp32. With groupID = laneid >> 2 and
//     threadID_in_group = laneid % 4, and elements numbered low to high across the registers (a0..a7 in four
//     .b32 registers of two 16-bit halves, b0..b3 in two, c0..c3 in four fp32 registers):
//       A: row = groupID (+8 for a2,a3,a6,a7),   col = 2·threadID_in_group + (i & 1) (+8 for i >= 4)
//       B: row = 2·threadID_in_group + (i & 1) (+8 for i >= 2),   col = groupID
//       C: row = groupID (+8 for i >= 2),        col = 2·threadID_in_group + (i & 1)
//
//   ldmatrix.sync.aligned.m8n8.{x1,x2,x4}{,.trans}.shared.b16  r, [p]
//     9.7.14.5.15 "Warp-level matrix load instruction: ldmatrix": each of the .num 8x8 matrices is eight rows
//     of eight 16-bit elements (16 bytes each), whose addresses lanes 8·m .. 8·m+7 supply for matrix m (only
//     lanes 0-7 for .x1 and 0-15 for .x2 are read; the others should hold copies). Register m of every lane
//     receives two elements of matrix m: row laneid >> 2, columns 2·(laneid % 4) and +1 (low half first);
//     with .trans the matrix is read column-major, so the same lane receives rows 2·(laneid % 4) and +1 of
//     column laneid >> 2.
//
// Every function here is constexpr and host-device: the kernels use them to place and read fragment elements,
// the host model of a warp (cuda/warp.h) implements the instructions from them, and the GPU self-test
// (attn_gpu_selftest) checks them against the hardware with one-hot matrices.
#pragma once

#include "core/hd.h"

namespace attn::cuda::frag {

// A position in a matrix (row, column).
struct Coord {
  int row = 0, col = 0;
  ATTN_HD constexpr bool operator==(const Coord& o) const { return row == o.row && col == o.col; }
};

// Where a fragment element lives: the lane, the register of that lane, and for packed 16-bit operands the half
// of the 32-bit register (0 = low 16 bits, the lower-numbered element; always 0 for the fp32 accumulators).
struct Slot {
  int lane = 0, reg = 0, half = 0;
  ATTN_HD constexpr bool operator==(const Slot& o) const {
    return lane == o.lane && reg == o.reg && half == o.half;
  }
};

inline constexpr int kWarp = 32;

// ---- mma.m16n8k16, .f16 / .bf16 operands, fp32 accumulators --------------------------------------------
inline constexpr int kMmaM = 16, kMmaN = 8, kMmaK = 16;
inline constexpr int kARegs = 4, kBRegs = 2, kCRegs = 4;  // 32-bit registers per lane

ATTN_HD constexpr int group_id(int lane) { return lane >> 2; }
ATTN_HD constexpr int thread_in_group(int lane) { return lane & 3; }

// Element a_i of A (i = 2·reg + half) held by `lane`.
ATTN_HD constexpr Coord mma_a(int lane, int reg, int half) {
  const int i = 2 * reg + half;
  const bool low_rows = i < 2 || (i >= 4 && i < 6);
  return {group_id(lane) + (low_rows ? 0 : 8), 2 * thread_in_group(lane) + (i & 1) + (i >= 4 ? 8 : 0)};
}
// The inverse: which lane, register and half hold A(row, col) (0 <= row, col < 16).
ATTN_HD constexpr Slot mma_a_slot(int row, int col) {
  return {4 * (row & 7) + ((col & 7) >> 1), (row >= 8 ? 1 : 0) + (col >= 8 ? 2 : 0), col & 1};
}

// Element b_i of B (i = 2·reg + half) held by `lane`.
ATTN_HD constexpr Coord mma_b(int lane, int reg, int half) {
  const int i = 2 * reg + half;
  return {2 * thread_in_group(lane) + (i & 1) + (i >= 2 ? 8 : 0), group_id(lane)};
}
// The inverse for B(row, col) (0 <= row < 16, 0 <= col < 8).
ATTN_HD constexpr Slot mma_b_slot(int row, int col) {
  return {4 * col + ((row & 7) >> 1), row >= 8 ? 1 : 0, row & 1};
}

// Accumulator c_i (= d_i) held by `lane`.
ATTN_HD constexpr Coord mma_c(int lane, int reg) {
  return {group_id(lane) + (reg >= 2 ? 8 : 0), 2 * thread_in_group(lane) + (reg & 1)};
}
// The inverse for C(row, col) (0 <= row < 16, 0 <= col < 8); half is always 0.
ATTN_HD constexpr Slot mma_c_slot(int row, int col) {
  return {4 * (row & 7) + (col >> 1), (row >= 8 ? 2 : 0) + (col & 1), 0};
}

// ---- ldmatrix.m8n8.b16 ---------------------------------------------------------------------------------
inline constexpr int kLdmRows = 8, kLdmCols = 8, kLdmRowBytes = 16;

// The lane whose address operand is read for row `row` of matrix `matrix`.
ATTN_HD constexpr int ldmatrix_address_lane(int matrix, int row) { return 8 * matrix + row; }
// A row of one of the matrices of an ldmatrix.
struct MatrixRow {
  int matrix = 0, row = 0;
};
// The row every lane should address for a load of `num` matrices: lane l addresses row l % 8 of matrix
// (l / 8) % num, so that the lanes .x1 and .x2 do not read hold copies of the ones they do (the PTX ISA asks
// for valid addresses there on older targets; the copies cost nothing).
ATTN_HD constexpr MatrixRow ldmatrix_addressed_row(int lane, int num) { return {(lane >> 3) % num, lane & 7}; }

// The element of an 8x8 matrix (row as addressed, column = 16-bit element within that row) that `lane`
// receives in the given half of the register for that matrix.
ATTN_HD constexpr Coord ldmatrix_elem(int lane, int half, bool trans) {
  return trans ? Coord{2 * (lane & 3) + half, lane >> 2} : Coord{lane >> 2, 2 * (lane & 3) + half};
}
// The inverse: which lane and half receive element (row, col) of a matrix (reg is left 0: it is the matrix).
ATTN_HD constexpr Slot ldmatrix_slot(int row, int col, bool trans) {
  return trans ? Slot{4 * col + (row >> 1), 0, row & 1} : Slot{4 * row + (col >> 1), 0, col & 1};
}

// ---- ldmatrix addressing of mma operands ---------------------------------------------------------------
// Which element of an operand tile in shared memory a lane's ldmatrix address must point to (the start of a
// 16-byte row), so that the registers loaded are exactly the mma fragments above. Derived from the two layouts;
// tests/test_cuda_host.cc checks each against the element-wise fragments, the GPU self-test on the hardware.

// A (16x16, stored row-major, k contiguous) by one ldmatrix.x4: register q = matrix q covers rows 8·(q & 1)..
// and columns 8·(q >> 1)..; lane l addresses row l % 16 at column 8·(l / 16).
ATTN_HD constexpr Coord ldsm_a_x4(int lane) { return {lane & 15, (lane >> 4) * 8}; }

// B stored n-major ([n][k], k contiguous: K rows for S = Q·Kᵀ), plain ldmatrix of num = 2 or 4 matrices:
// matrix q holds n-block q / 2 (columns 8·(q / 2)..) at k half q % 2, so registers {r[2j], r[2j+1]} are the B
// fragment of n-block j. Returns (n, k) of the row start.
ATTN_HD constexpr Coord ldsm_b_nk(int lane, int num) {
  const MatrixRow mr = ldmatrix_addressed_row(lane, num);
  return {(mr.matrix >> 1) * 8 + mr.row, (mr.matrix & 1) * 8};
}

// B stored k-major ([k][n], n contiguous: V rows for O = P·V), transposing ldmatrix of num = 2 or 4 matrices:
// matrix q holds k half q % 2 of n-block q / 2, so again {r[2j], r[2j+1]} are n-block j's fragment. Returns
// (k, n) of the row start.
ATTN_HD constexpr Coord ldsm_b_kn_trans(int lane, int num) {
  const MatrixRow mr = ldmatrix_addressed_row(lane, num);
  return {(mr.matrix & 1) * 8 + mr.row, (mr.matrix >> 1) * 8};
}

}  // namespace attn::cuda::frag
