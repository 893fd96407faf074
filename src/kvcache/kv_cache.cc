// KV caches: contiguous per sequence, and paged (a pool of pages with a free list).
#include "attn/kv_cache.h"

#include <algorithm>
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
  if (Status s = positive("kv_heads", kv_heads); !s) return s;
  if (Status s = positive("head_dim", head_dim); !s) return s;
  if (Status s = positive("v_head_dim", v_head_dim); !s) return s;
  if (Status s = positive("capacity", capacity); !s) return s;
  KVCache c;
  c.hkv_ = kv_heads, c.dk_ = head_dim, c.dv_ = v_head_dim, c.capacity_ = capacity;
  c.k_.assign(static_cast<std::size_t>(kv_heads * capacity * head_dim), 0.0f);
  c.v_.assign(static_cast<std::size_t>(kv_heads * capacity * v_head_dim), 0.0f);
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
  // The whole cache is one page of `capacity` tokens, so decode takes attention_paged's split-KV path.
  TensorView k = keys(), v = values();
  k.shape[2] = v.shape[2] = capacity_;
  std::int32_t table[1] = {0};
  std::int64_t lens[1] = {length_};
  return attention_paged(q, k, v, TensorView::contiguous(table, DType::i32, {1, 1}),
                         TensorView::contiguous(lens, DType::i64, {1}), out, params, lse);
}

// ---- PagedKVCache -----------------------------------------------------------------------------------

Status PagedKVCache::create(std::int64_t kv_heads, std::int64_t head_dim, std::int64_t v_head_dim,
                            std::int64_t page_size, std::int64_t num_pages, PagedKVCache* cache) {
  if (v_head_dim == 0) v_head_dim = head_dim;
  if (Status s = positive("kv_heads", kv_heads); !s) return s;
  if (Status s = positive("head_dim", head_dim); !s) return s;
  if (Status s = positive("v_head_dim", v_head_dim); !s) return s;
  if (Status s = positive("page_size", page_size); !s) return s;
  if (Status s = positive("num_pages", num_pages); !s) return s;
  if (num_pages > INT32_MAX) return Status::Invalid("num_pages", str(num_pages) + "; expected at most 2^31 - 1");
  PagedKVCache c;
  c.hkv_ = kv_heads, c.dk_ = head_dim, c.dv_ = v_head_dim, c.page_size_ = page_size, c.num_pages_ = num_pages;
  c.k_.assign(static_cast<std::size_t>(num_pages * kv_heads * page_size * head_dim), 0.0f);
  c.v_.assign(static_cast<std::size_t>(num_pages * kv_heads * page_size * v_head_dim), 0.0f);
  for (std::int64_t p = num_pages - 1; p >= 0; --p) c.free_.push_back(static_cast<std::int32_t>(p));
  c.is_free_.assign(static_cast<std::size_t>(num_pages), 1);
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
  if (q.rank == 4 && q.shape[0] != batch)
    return Status::Invalid("q", "batch " + str(q.shape[0]) + "; expected " + str(batch) + " (one row per sequence id)");
  const TensorView table_view = TensorView::contiguous(table.data(), DType::i32, {batch, width});
  const TensorView lens_view = TensorView::contiguous(lens.data(), DType::i32, {batch});
  return attention_paged(q, k_pages(), v_pages(), table_view, lens_view, out, params, lse);
}

}  // namespace attn
