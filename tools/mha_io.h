// attn tools: MultiHeadAttention weights as .npy files in a directory.
//
//   DIR/w_q.npy [Hq·Dk, d_model]   DIR/w_k.npy [Hkv·Dk, d_model]   DIR/w_v.npy [Hkv·Dv, d_model]
//   DIR/w_o.npy [d_model, Hq·Dv]   and, with biases, DIR/b_q.npy [Hq·Dk] ... DIR/b_o.npy [d_model]
// float32, PyTorch nn.Linear layout (numpy.save(dir + "/w_q.npy", q_proj.weight.detach().numpy()) works).
// The weight I/O lives in the tools, next to the .npy reader, so the library itself does no file I/O.
#pragma once

#include <string>

#include "attn/mha.h"

namespace attn::tools {

// Writes the weights of `mha` (biases only when config().bias).
Status save_mha_weights(const std::string& dir, const MultiHeadAttention& mha);
// Creates *mha from `config` and reads every file, checking its shape; b_*.npy are read when config.bias.
// On error *mha is unchanged and the message names the file.
Status load_mha_weights(const std::string& dir, const MhaConfig& config, MultiHeadAttention* mha);

}  // namespace attn::tools
