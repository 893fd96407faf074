// KV caches: contiguous per sequence, and paged (a pool of pages with a free list).
#include "attn/kv_cache.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <new>
#include <string>

namespace attn {
namespace {

std::string str(std::int64_t x) { return std::to_string(x); }

Status positive(const char* name, std::int64_t value) {
  if (value < 1) return Status::Invalid(name, str(value) + "; expected >= 1");
  return Status::Ok();
}

// Checks that `t` is an f32 [1, heads, T, dim] view (T >= 0) and returns T.
Status check_tokens(const char* name, const TensorView& t, std::int64_t heads, std::int64_t dim, std::int64_t* tokens) {
  if (t.rank != 4) return Status::Invalid(name, "rank " + str(t.rank) + "; expected rank 4 [1, Hkv, T, D]");
  if (t.dtype != DType::f32) return Status::Invalid(name, std::string("dtype ") + dtype_name(t.dtype) + "; expected f32");
  if (t.shape[0] != 1) return Status::Invalid(name, "batch " + str(t.shape[0]) + "; expected 1 (one sequence)");
  if (t.shape[1] != heads) return Status::Invalid(name, "heads " + str(t.shape[1]) + "; expected Hkv = " + str(heads));
  if (t.shape[3] != dim) return Status::Invalid(name, "head dim " + str(t.shape[3]) + "; expected " + str(dim));
  if (t.shape[2] < 0) return Status::Invalid(name, "token count " + str(t.shape[2]) + "; expected >= 0");
  if (t.shape[2] > 0 && !t.data) return Status::Invalid(name, "data is null; expected a buffer");
  *tokens = t.shape[2];
  return Status::Ok();
}

Status check_pair(const TensorView& k, const TensorView& v, std::int64_t hkv, std::int64_t dk, std::int64_t dv,
                  std::int64_t* tokens) {
  std::int64_t tk = 0, tv = 0;
  if (Status s = check_tokens("k", k, hkv, dk, &tk); !s) return s;
  if (Status s = check_tokens("v", v, hkv, dv, &tv); !s) return s;
  if (tk != tv) return Status::Invalid("v", "token count " + str(tv) + "; expected " + str(tk) + " (as k)");
  *tokens = tk;
  return Status::Ok();
}

// Sizes a cache is created with: what attention_paged accepts for the views it is read through.
Status check_dims(std::int64_t kv_heads, std::int64_t head_dim, std::int64_t v_head_dim) {
  if (Status s = positive("kv_heads", kv_heads); !s) return s;
  if (Status s = positive("head_dim", head_dim); !s) return s;
  if (Status s = positive("v_head_dim", v_head_dim); !s) return s;
  if (kv_heads > kMaxExtent)
    return Status::Invalid("kv_heads", str(kv_heads) + "; expected at most " + str(kMaxExtent) + " (attn::kMaxExtent)");
  if (head_dim > kMaxHeadDim)
    return Status::Invalid("head_dim", str(head_dim) + "; expected at most " + str(kMaxHeadDim) + " (attn::kMaxHeadDim)");
  if (v_head_dim > kMaxHeadDim)
    return Status::Invalid("v_head_dim", str(v_head_dim) + "; expected at most " + str(kMaxHeadDim) +
                                             " (attn::kMaxHeadDim)");
  return Status::Ok();
}

// Allocates the K and V storage (zeroed) of `tokens` slots per head: an OutOfMemory Status naming `param` when
// the size overflows or the allocation fails (nothing else changes).
Status allocate(const char* param, std::int64_t heads_times_tokens, std::int64_t dk, std::int64_t dv,
                std::vector<float>* k, std::vector<float>* v) {
  std::int64_t nk = 0, nv = 0, total = 0;
  const bool overflow = __builtin_mul_overflow(heads_times_tokens, dk, &nk) ||
                        __builtin_mul_overflow(heads_times_tokens, dv, &nv) || __builtin_add_overflow(nk, nv, &total) ||
                        total > static_cast<std::int64_t>(PTRDIFF_MAX / sizeof(float));
  const double bytes = static_cast<double>(heads_times_tokens) * static_cast<double>(dk + dv) * sizeof(float);
  char need[64];
  std::snprintf(need, sizeof need, "%.4g GiB", bytes / (1024.0 * 1024.0 * 1024.0));
  if (overflow)
    return Status::OutOfMemory(param, std::string("the cache would need ") + need +
                                          " of keys and values, more than can be addressed; expected a smaller cache");
  try {
    k->assign(static_cast<std::size_t>(nk), 0.0f);
    v->assign(static_cast<std::size_t>(nv), 0.0f);
  } catch (const std::bad_alloc&) {
    *k = {}, *v = {};
    return Status::OutOfMemory(param, std::string("could not allocate the cache's ") + need +
                                          " of keys and values; expected a cache that fits in memory");
  }
  return Status::Ok();
}

// A decode step's q [B, Hq, T, Dk], out [B, Hq, T, Dv] and lse [B, Hq, T] against a cache of Hkv heads of
// head dims Dk/Dv, checked before attention_paged sees them (whose messages would name its own parameters).
// `batch` is the number of sequences (`batch_what` says why).
Status check_decode(const TensorView& q, const TensorView& out, const std::optional<TensorView>& lse,
                    const Params& params, std::int64_t batch, const char* batch_what, std::int64_t hkv, std::int64_t dk,
                    std::int64_t dv) {
  if (q.rank != 4) return Status::Invalid("q", "rank " + str(q.rank) + "; expected rank 4 [B, Hq, T, Dk]");
  if (q.shape[0] != batch)
    return Status::Invalid("q", "batch " + str(q.shape[0]) + "; expected " + str(batch) + " (" + batch_what + ")");
  const std::int64_t hq = q.shape[1], t = q.shape[2];
  if (hq < 1 || hq % hkv != 0)
    return Status::Invalid("q", "heads " + str(hq) + "; expected a positive multiple of Hkv = " + str(hkv) +
                                    " (the cache's kv_heads)");
  if (t < 0) return Status::Invalid("q", "token count " + str(t) + "; expected >= 0");
  if (q.shape[3] != dk)
    return Status::Invalid("q", "head dim " + str(q.shape[3]) + "; expected Dk = " + str(dk) + " (the cache's head_dim)");
  const std::string want = "[" + str(batch) + ", " + str(hq) + ", " + str(t) + ", " + str(dv) + "]";
  if (out.rank != 4)
    return Status::Invalid("out", "rank " + str(out.rank) + "; expected rank 4 " + want + " ([B, Hq, T, Dv])");
  if (out.shape[0] != batch || out.shape[1] != hq || out.shape[2] != t || out.shape[3] != dv)
    return Status::Invalid("out", "shape [" + str(out.shape[0]) + ", " + str(out.shape[1]) + ", " + str(out.shape[2]) +
                                      ", " + str(out.shape[3]) + "]; expected " + want + " ([B, Hq, T, Dv], Dv = " +
                                      str(dv) + " the cache's v_head_dim)");
  if (lse) {
    const std::string lwant = "[" + str(batch) + ", " + str(hq) + ", " + str(t) + "]";
    if (lse->rank != 3)
      return Status::Invalid("lse", "rank " + str(lse->rank) + "; expected rank 3 " + lwant + " ([B, Hq, T])");
    if (lse->shape[0] != batch || lse->shape[1] != hq || lse->shape[2] != t)
      return Status::Invalid("lse", "shape [" + str(lse->shape[0]) + ", " + str(lse->shape[1]) + ", " +
                                        str(lse->shape[2]) + "]; expected " + lwant + " ([B, Hq, T])");
  }
  if (params.kv_lens)
    return Status::Invalid("kv_lens", "is set; expected it empty (the cache knows each sequence's length)");
  return Status::Ok();
}

// An error of the attention_paged call that reads the cache, in the caller's terms: the pages, the page table
// and the lengths are the cache's, not arguments the caller passed, so each of those names becomes "cache".
Status as_cache_error(const Status& s) {
  if (s.ok()) return s;
  static const char* const internal[] = {"k_pages", "v_pages", "page_table", "seq_lens"};
  const auto rename = [](std::string text) {
    for (const char* name : internal) {
      const std::string from = name;
      for (std::size_t at = text.find(from); at != std::string::npos; at = text.find(from, at + 5))
        text.replace(at, from.size(), "cache");
    }
    return text;
  };
  const std::string param = rename(s.param());
  const std::string body = rename(s.message().substr(std::min(s.message().size(), s.param().size() + 2)));
  switch (s.code()) {
    case StatusCode::unsupported: return Status::Unsupported(param, body);
    case StatusCode::out_of_memory: return Status::OutOfMemory(param, body);
    default: return Status::Invalid(param, body);
  }
}

// dst[t * dim + d] = src[0, h, t, d] for one head.
void copy_head(const TensorView& src, std::int64_t h, std::int64_t t0, std::int64_t count, float* dst) {
  const auto* p = static_cast<const float*>(src.data);
  const std::int64_t dim = src.shape[3];
  for (std::int64_t t = 0; t < count; ++t)
    for (std::int64_t d = 0; d < dim; ++d)
      dst[t * dim + d] = p[h * src.strides[1] + (t0 + t) * src.strides[2] + d * src.strides[3]];
}

}  // namespace

Params decode_params() {
  Params p;
  p.causal = Causal::bottom_right;
  return p;
}

// ---- KVCache ----------------------------------------------------------------------------------------

Status KVCache::create(std::int64_t kv_heads, std::int64_t head_dim, std::int64_t v_head_dim, std::int64_t capacity,
                       KVCache* cache) {
  if (v_head_dim == 0) v_head_dim = head_dim;
  if (Status s = check_dims(kv_heads, head_dim, v_head_dim); !s) return s;
  if (Status s = positive("capacity", capacity); !s) return s;
  // attend() reads the whole cache as one page of `capacity` tokens.
  if (capacity > kMaxExtent)
    return Status::Invalid("capacity", str(capacity) + "; expected at most " + str(kMaxExtent) + " (attn::kMaxExtent)");
  KVCache c;
  c.hkv_ = kv_heads, c.dk_ = head_dim, c.dv_ = v_head_dim, c.capacity_ = capacity;
  // kv_heads · capacity < 2^62: no overflow.
  if (Status s = allocate("capacity", kv_heads * capacity, head_dim, v_head_dim, &c.k_, &c.v_); !s) return s;
  *cache = std::move(c);
  return Status::Ok();
}

Status KVCache::append(const TensorView& k, const TensorView& v) {
  std::int64_t t = 0;
  if (Status s = check_pair(k, v, hkv_, dk_, dv_, &t); !s) return s;
  if (t > capacity_ - length_)
    return Status::Invalid("k", "appending " + str(t) + " tokens to a cache holding " + str(length_) + " of " +
                                    str(capacity_) + "; expected at most " + str(capacity_ - length_));
  for (std::int64_t h = 0; h < hkv_; ++h) {
    copy_head(k, h, 0, t, &k_[static_cast<std::size_t>((h * capacity_ + length_) * dk_)]);
    copy_head(v, h, 0, t, &v_[static_cast<std::size_t>((h * capacity_ + length_) * dv_)]);
  }
  length_ += t;
  return Status::Ok();
}

Status KVCache::truncate(std::int64_t length) {
  if (length < 0 || length > length_)
    return Status::Invalid("length", str(length) + "; expected 0 .. " + str(length_) + " (the cached length)");
  length_ = length;
  return Status::Ok();
}

TensorView KVCache::keys() const {
  TensorView t;
  t.data = const_cast<float*>(k_.data());
  t.rank = 4;
  t.shape = {1, hkv_, length_, dk_};
  t.strides = {hkv_ * capacity_ * dk_, capacity_ * dk_, dk_, 1};
  return t;
}

TensorView KVCache::values() const {
  TensorView t;
  t.data = const_cast<float*>(v_.data());
  t.rank = 4;
  t.shape = {1, hkv_, length_, dv_};
  t.strides = {hkv_ * capacity_ * dv_, capacity_ * dv_, dv_, 1};
  return t;
}

Status KVCache::attend(const TensorView& q, const TensorView& out, const Params& params,
                       const std::optional<TensorView>& lse) const {
  if (capacity_ == 0) return Status::Invalid("cache", "not created; expected KVCache::create first");
  if (Status s = check_decode(q, out, lse, params, 1, "one sequence", hkv_, dk_, dv_); !s) return s;
  // The whole cache is one page of `capacity` tokens, so decode takes attention_paged's split-KV path.
  TensorView k = keys(), v = values();
  k.shape[2] = v.shape[2] = capacity_;
  std::int32_t table[1] = {0};
  std::int64_t lens[1] = {length_};
  return as_cache_error(attention_paged(q, k, v, TensorView::contiguous(table, DType::i32, {1, 1}),
                                        TensorView::contiguous(lens, DType::i64, {1}), out, params, lse));
}

// ---- PagedKVCache -----------------------------------------------------------------------------------

Status PagedKVCache::create(std::int64_t kv_heads, std::int64_t head_dim, std::int64_t v_head_dim,
                            std::int64_t page_size, std::int64_t num_pages, PagedKVCache* cache) {
  if (v_head_dim == 0) v_head_dim = head_dim;
  if (Status s = check_dims(kv_heads, head_dim, v_head_dim); !s) return s;
  if (Status s = positive("page_size", page_size); !s) return s;
  if (Status s = positive("num_pages", num_pages); !s) return s;
  if (page_size > kMaxExtent)
    return Status::Invalid("page_size", str(page_size) + "; expected at most " + str(kMaxExtent) + " (attn::kMaxExtent)");
  if (num_pages > INT32_MAX) return Status::Invalid("num_pages", str(num_pages) + "; expected at most 2^31 - 1");
  PagedKVCache c;
  c.hkv_ = kv_heads, c.dk_ = head_dim, c.dv_ = v_head_dim, c.page_size_ = page_size, c.num_pages_ = num_pages;
  std::int64_t slots = 0;  // num_pages · kv_heads · page_size
  if (__builtin_mul_overflow(num_pages * kv_heads, page_size, &slots))  // (the first product is below 2^62)
    return Status::OutOfMemory("num_pages", "the pool's " + str(num_pages) + " pages of " + str(kv_heads) + " x " +
                                                str(page_size) + " tokens are more than can be addressed; expected a "
                                                "smaller pool");
  if (Status s = allocate("num_pages", slots, head_dim, v_head_dim, &c.k_, &c.v_); !s) return s;
  try {
    c.free_.reserve(static_cast<std::size_t>(num_pages));
    for (std::int64_t p = num_pages - 1; p >= 0; --p) c.free_.push_back(static_cast<std::int32_t>(p));
    c.is_free_.assign(static_cast<std::size_t>(num_pages), 1);
  } catch (const std::bad_alloc&) {
    return Status::OutOfMemory("num_pages", "could not allocate the free list of " + str(num_pages) +
                                                " pages; expected a pool that fits in memory");
  }
  *cache = std::move(c);
  return Status::Ok();
}

bool PagedKVCache::page_is_free(std::int64_t page) const {
  return page >= 0 && page < num_pages_ && is_free_[static_cast<std::size_t>(page)];
}

std::int64_t PagedKVCache::add_sequence() {
  const std::int64_t id = next_id_++;
  seqs_[id] = Sequence{};
  return id;
}

Status PagedKVCache::find(std::int64_t id, const Sequence** seq) const {
  const auto it = seqs_.find(id);
  if (it == seqs_.end())
    return Status::Invalid("sequence", "id " + str(id) + " does not exist; expected an id from add_sequence() "
                                                          "that has not been removed");
  *seq = &it->second;
  return Status::Ok();
}

Status PagedKVCache::truncate(std::int64_t id, std::int64_t length) {
  const Sequence* found = nullptr;
  if (Status s = find(id, &found); !s) return s;
  Sequence& seq = seqs_[id];
  if (length < 0 || length > seq.length)
    return Status::Invalid("length", str(length) + "; expected 0 .. " + str(seq.length) + " (the sequence's length)");
  const std::size_t keep = static_cast<std::size_t>((length + page_size_ - 1) / page_size_);
  while (seq.pages.size() > keep) {
    const std::int32_t p = seq.pages.back();
    seq.pages.pop_back();
    free_.push_back(p);
    is_free_[static_cast<std::size_t>(p)] = 1;
  }
  seq.length = length;
  return Status::Ok();
}

Status PagedKVCache::remove_sequence(std::int64_t id) {
  if (Status s = truncate(id, 0); !s) return s;
  seqs_.erase(id);
  return Status::Ok();
}

Status PagedKVCache::length(std::int64_t id, std::int64_t* len) const {
  const Sequence* seq = nullptr;
  if (Status s = find(id, &seq); !s) return s;
  *len = seq->length;
  return Status::Ok();
}

Status PagedKVCache::pages(std::int64_t id, std::vector<std::int32_t>* out) const {
  const Sequence* seq = nullptr;
  if (Status s = find(id, &seq); !s) return s;
  *out = seq->pages;
  return Status::Ok();
}

Status PagedKVCache::append(std::int64_t id, const TensorView& k, const TensorView& v) {
  const Sequence* found = nullptr;
  if (Status s = find(id, &found); !s) return s;
  std::int64_t t = 0;
  if (Status s = check_pair(k, v, hkv_, dk_, dv_, &t); !s) return s;
  Sequence& seq = seqs_[id];
  const std::int64_t need = (seq.length + t + page_size_ - 1) / page_size_ - static_cast<std::int64_t>(seq.pages.size());
  if (need > free_pages())
    return Status::Invalid("k", "appending " + str(t) + " tokens to sequence " + str(id) + " needs " + str(need) +
                                    " more pages; expected at most the " + str(free_pages()) + " free pages of the pool");
  for (std::int64_t n = 0; n < need; ++n) {
    const std::int32_t p = free_.back();
    free_.pop_back();
    is_free_[static_cast<std::size_t>(p)] = 0;
    seq.pages.push_back(p);
  }
  // Copy token by token into (page, slot); a run of tokens within one page is one copy per head.
  std::int64_t done = 0;
  while (done < t) {
    const std::int64_t pos = seq.length + done, slot = pos % page_size_;
    const std::int64_t run = std::min(t - done, page_size_ - slot);
    const std::int64_t page = seq.pages[static_cast<std::size_t>(pos / page_size_)];
    for (std::int64_t h = 0; h < hkv_; ++h) {
      copy_head(k, h, done, run, &k_[static_cast<std::size_t>(((page * hkv_ + h) * page_size_ + slot) * dk_)]);
      copy_head(v, h, done, run, &v_[static_cast<std::size_t>(((page * hkv_ + h) * page_size_ + slot) * dv_)]);
    }
    done += run;
  }
  seq.length += t;
  return Status::Ok();
}

TensorView PagedKVCache::k_pages() const {
  TensorView t;
  t.data = const_cast<float*>(k_.data());
  t.rank = 4;
  t.shape = {num_pages_, hkv_, page_size_, dk_};
  t.strides = {hkv_ * page_size_ * dk_, page_size_ * dk_, dk_, 1};
  return t;
}

TensorView PagedKVCache::v_pages() const {
  TensorView t;
  t.data = const_cast<float*>(v_.data());
  t.rank = 4;
  t.shape = {num_pages_, hkv_, page_size_, dv_};
  t.strides = {hkv_ * page_size_ * dv_, page_size_ * dv_, dv_, 1};
  return t;
}

Status PagedKVCache::tables(const std::vector<std::int64_t>& ids, std::vector<std::int32_t>* page_table,
                            std::int64_t* max_pages, std::vector<std::int32_t>* seq_lens) const {
  if (ids.empty()) return Status::Invalid("ids", "empty; expected at least one sequence id");
  std::vector<const Sequence*> seqs;
  std::int64_t widest = 1;
  for (std::size_t b = 0; b < ids.size(); ++b) {
    for (std::size_t c = 0; c < b; ++c)
      if (ids[c] == ids[b])
        return Status::Invalid("ids", "sequence " + str(ids[b]) + " appears twice; expected distinct ids");
    const Sequence* seq = nullptr;
    if (Status s = find(ids[b], &seq); !s) return s;
    if (seq->length > INT32_MAX) return Status::Invalid("ids", "sequence " + str(ids[b]) + " is longer than 2^31 - 1");
    seqs.push_back(seq);
    widest = std::max<std::int64_t>(widest, static_cast<std::int64_t>(seq->pages.size()));
  }
  page_table->assign(ids.size() * static_cast<std::size_t>(widest), -1);
  seq_lens->resize(ids.size());
  for (std::size_t b = 0; b < ids.size(); ++b) {
    std::copy(seqs[b]->pages.begin(), seqs[b]->pages.end(), page_table->begin() + static_cast<std::ptrdiff_t>(b * widest));
    (*seq_lens)[b] = static_cast<std::int32_t>(seqs[b]->length);
  }
  *max_pages = widest;
  return Status::Ok();
}

Status PagedKVCache::attend(const std::vector<std::int64_t>& ids, const TensorView& q, const TensorView& out,
                            const Params& params, const std::optional<TensorView>& lse) const {
  if (num_pages_ == 0) return Status::Invalid("cache", "not created; expected PagedKVCache::create first");
  std::vector<std::int32_t> table, lens;
  std::int64_t width = 0;
  if (Status s = tables(ids, &table, &width, &lens); !s) return s;
  const std::int64_t batch = static_cast<std::int64_t>(ids.size());
  if (Status s = check_decode(q, out, lse, params, batch, "one row per sequence id", hkv_, dk_, dv_); !s) return s;
  const TensorView table_view = TensorView::contiguous(table.data(), DType::i32, {batch, width});
  const TensorView lens_view = TensorView::contiguous(lens.data(), DType::i32, {batch});
  return as_cache_error(attention_paged(q, k_pages(), v_pages(), table_view, lens_view, out, params, lse));
}

}  // namespace attn
