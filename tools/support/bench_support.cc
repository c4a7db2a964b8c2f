// SyntheticKv and ReadBandwidthProbe (bench_support.h).
#include "tools/support/bench_support.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <numeric>
#include <random>
#include <thread>

#include <sys/mman.h>
#include <time.h>

#include "kvcache/attention_profile.h"

namespace kvcache::attention_internal {

PoolBytes::~PoolBytes() {
  if (map_ != nullptr) munmap(map_, map_bytes_);
}

Status PoolBytes::Allocate(size_t bytes, bool huge_pages) {
  constexpr size_t kHuge = size_t{2} << 20;
  const size_t n = std::max<size_t>(bytes, 1) + kHuge;
  void* m = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) return Status::PoolExhausted("synthetic kv: mmap failed");
  if (map_ != nullptr) munmap(map_, map_bytes_);
  map_ = m;
  map_bytes_ = n;
  const uintptr_t a = (reinterpret_cast<uintptr_t>(m) + kHuge - 1) & ~(kHuge - 1);
  data_ = reinterpret_cast<uint8_t*>(a);
  // Advice before the first touch, so that faults allocate huge pages.
  if (huge_pages) madvise(data_, (bytes + kHuge - 1) & ~(kHuge - 1), MADV_HUGEPAGE);
  return Status::Ok();
}

Result<std::unique_ptr<SyntheticKv>> SyntheticKv::Create(const SyntheticKvOptions& o) {
  auto s = std::unique_ptr<SyntheticKv>(new SyntheticKv());
  const uint32_t d = o.head_dim, nkv = o.n_kv_heads, n = std::max(1u, o.num_tokens);
  KV_ASSIGN_OR_RETURN(RowCodec kc, RowCodec::Create(o.formats.k, d, Side::kKey));
  KV_ASSIGN_OR_RETURN(RowCodec vc, RowCodec::Create(o.formats.v, d, Side::kValue));
  s->k_codec_ = std::make_unique<RowCodec>(kc);
  s->v_codec_ = std::make_unique<RowCodec>(vc);
  // Encode a few distinct rows per side, then tile storage with them.
  const uint32_t distinct = std::max(1u, std::min(o.distinct_rows, n));
  std::mt19937_64 rng(o.seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> rows(size_t{distinct} * d);
  for (auto& x : rows) x = normal(rng);
  std::vector<uint8_t> k_rows(distinct * kc.row_bytes()), v_rows(distinct * vc.row_bytes());
  KV_RETURN_IF_ERROR(kc.Encode(rows, k_rows));
  for (auto& x : rows) x = normal(rng);
  KV_RETURN_IF_ERROR(vc.Encode(rows, v_rows));

  LayerKvView& v = s->view_;
  v.n_kv_heads = nkv;
  v.head_dim = d;
  v.num_tokens = n;
  const uint32_t bs = o.paged ? o.block_size : n;
  const uint32_t blocks = (n + bs - 1) / bs;
  v.block_size = bs;
  v.num_blocks = blocks;
  s->table_.resize(blocks);
  std::iota(s->table_.begin(), s->table_.end(), 0u);
  if (o.paged) std::shuffle(s->table_.begin(), s->table_.end(), rng);
  v.block_table = s->table_.data();
  auto fill = [&](KvSideView& side, const RowCodec& c, const std::vector<uint8_t>& enc,
                  PoolBytes& store) -> Status {
    const size_t rb = c.row_bytes();
    side.format = c.format();
    side.row_bytes = static_cast<uint32_t>(rb);
    side.codec = &c;
    side.head_stride = size_t{bs} * rb;
    side.block_stride = size_t{nkv} * side.head_stride;
    KV_RETURN_IF_ERROR(store.Allocate(size_t{blocks} * side.block_stride, o.huge_pages));
    side.base = store.data();
    for (uint32_t h = 0; h < nkv; ++h) {
      for (uint32_t r = 0; r < n; ++r) {
        uint8_t* dst = store.data() + size_t{s->table_[r / bs]} * side.block_stride +
                       h * side.head_stride + size_t{r % bs} * rb;
        std::memcpy(dst, enc.data() + size_t{(r + 7 * h) % distinct} * rb, rb);
      }
    }
    return Status::Ok();
  };
  KV_RETURN_IF_ERROR(fill(v.k, *s->k_codec_, k_rows, s->k_));
  KV_RETURN_IF_ERROR(fill(v.v, *s->v_codec_, v_rows, s->v_));
  s->kv_bytes_ = size_t{n} * nkv * (kc.row_bytes() + vc.row_bytes());
  return s;
}

ReadBandwidthProbe::ReadBandwidthProbe(size_t bytes) : data_(bytes / sizeof(uint64_t)) {
  for (size_t i = 0; i < data_.size(); ++i) data_[i] = i * 0x9E3779B97F4A7C15ull;
}

namespace {
// Sums n bytes at p as 16-byte vector words (any alignment), four
// independent sums so the loop is load-bound, not add-latency bound. Wide
// loads matter: with 8-byte loads a walk over scattered 4 KiB pieces keeps
// fewer cache lines in flight and is markedly slower than the same walk
// with 16- or 32-byte loads (docs/perf/attention.md), which would overstate
// the memory floor of the paged layout.
uint64_t ReadBytes(const uint8_t* p, size_t n) {
  using V2 = uint64_t __attribute__((vector_size(16)));
  V2 a = {0, 0}, b = a, c = a, d = a;
  size_t i = 0;
  for (; i + 64 <= n; i += 64) {
    V2 w[4];
    std::memcpy(w, p + i, sizeof(w));
    a += w[0];
    b ^= w[1];
    c += w[2];
    d ^= w[3];
  }
  uint64_t tail = 0;
  for (; i < n; ++i) tail += p[i];
  const V2 t = a + b + c + d;
  return tail + t[0] + t[1];
}

std::atomic<uint64_t> g_sink{0};
}  // namespace

double ProcessCpuSeconds() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

double TscHz() {
  static const double hz = [] {
#if defined(__x86_64__) || defined(__i386__)
    const auto t0 = std::chrono::steady_clock::now();
    // The counter AttentionPassTime::ticks reads on x86 (attention_profile.h).
    const uint64_t c0 = __builtin_ia32_rdtsc();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    const uint64_t c1 = __builtin_ia32_rdtsc();
    const auto t1 = std::chrono::steady_clock::now();
    return static_cast<double>(c1 - c0) / std::chrono::duration<double>(t1 - t0).count();
#else
    return 1e9;
#endif
  }();
  return hz;
}

double CoreHzEstimate() {
#if defined(__x86_64__)
  auto thread_cpu = [] {
    timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
  };
  constexpr uint64_t kIters = 8u << 20;  // 16 dependent adds each
  uint64_t x = 0;
  const double c0 = thread_cpu();
  for (uint64_t i = 0; i < kIters; ++i) {
    asm volatile(
        "add $1, %0\n\tadd $1, %0\n\tadd $1, %0\n\tadd $1, %0\n\t"
        "add $1, %0\n\tadd $1, %0\n\tadd $1, %0\n\tadd $1, %0\n\t"
        "add $1, %0\n\tadd $1, %0\n\tadd $1, %0\n\tadd $1, %0\n\t"
        "add $1, %0\n\tadd $1, %0\n\tadd $1, %0\n\tadd $1, %0"
        : "+r"(x));
  }
  const double s = thread_cpu() - c0;
  g_sink.fetch_add(x, std::memory_order_relaxed);
  return static_cast<double>(16 * kIters) / s;
#else
  return 0.0;
#endif
}

double ReadBandwidthProbe::MeasureOnce(ThreadPool* pool, double* cpu_gb_per_s) {
  const uint32_t threads = pool ? pool->num_threads() : 1;
  const size_t n = data_.size();
  const uint32_t tasks = threads * 8;
  const double c0 = ProcessCpuSeconds();
  const auto t0 = std::chrono::steady_clock::now();
  auto body = [&](uint32_t t, uint32_t) {
    const size_t lo = n * t / tasks, hi = n * (t + 1) / tasks;
    g_sink.fetch_add(ReadBytes(reinterpret_cast<const uint8_t*>(data_.data() + lo), (hi - lo) * sizeof(uint64_t)), std::memory_order_relaxed);
  };
  if (pool) {
    pool->ParallelFor(tasks, body);
  } else {
    for (uint32_t t = 0; t < tasks; ++t) body(t, 0);
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double cpu = (ProcessCpuSeconds() - c0) / threads;
  if (cpu_gb_per_s) *cpu_gb_per_s = static_cast<double>(n * sizeof(uint64_t)) / cpu / 1e9;
  return static_cast<double>(n * sizeof(uint64_t)) / s / 1e9;
}

namespace {
struct Piece {
  const uint8_t* p;
  size_t bytes;
};

// Rows [r0, r1) of one head on one side, appended in the kernels' order as
// pieces of at most kMaxPiece bytes (runs of consecutive rows inside one
// block, or inside a head's own buffer, cut so the prefetch stream below
// stays about kPrefetchAhead ahead).
constexpr size_t kMaxPiece = 4096;
void AddRun(const uint8_t* p, size_t bytes, std::vector<Piece>* out) {
  for (size_t at = 0; at < bytes; at += kMaxPiece) out->push_back({p + at, std::min(kMaxPiece, bytes - at)});
}
void AddPieces(const LayerKvView& v, const KvSideView& s, uint32_t head, uint32_t r0, uint32_t r1,
               std::vector<Piece>* out) {
  if (r0 >= r1) return;
  if (s.head_base != nullptr) {
    AddRun(s.head_base[head] + size_t{r0} * s.row_bytes, size_t{r1 - r0} * s.row_bytes, out);
    return;
  }
  const uint32_t bs = v.block_size;
  for (uint32_t r = r0; r < r1;) {
    const uint32_t b = r / bs, off = r - b * bs, n = std::min(bs - off, r1 - r);
    AddRun(s.base + static_cast<size_t>(v.block_table[b]) * s.block_stride +
               static_cast<size_t>(head) * s.head_stride + size_t{off} * s.row_bytes,
           size_t{n} * s.row_bytes, out);
    r += n;
  }
}

// Reads the pieces in order with a software prefetch stream about as far
// ahead as the kernels' (kPrefetchAhead bytes, whole pieces): without it a
// walk over small scattered pieces measures memory latency, not the
// pattern's bandwidth.
constexpr size_t kPrefetchAhead = 6144;
uint64_t ReadPieces(const std::vector<Piece>& pieces) {
  size_t next = 0, ahead_bytes = 0;
  uint64_t sum = 0;
  for (const Piece& pc : pieces) {
    while (next < pieces.size() && ahead_bytes < kPrefetchAhead + pc.bytes) {
      for (size_t i = 0; i < pieces[next].bytes; i += 64) __builtin_prefetch(pieces[next].p + i, 0, 3);
      ahead_bytes += pieces[next].bytes;
      ++next;
    }
    sum += ReadBytes(pc.p, pc.bytes);
    ahead_bytes -= pc.bytes;
  }
  return sum;
}
}  // namespace

double ReadLikeAttention(const std::vector<LayerKvView>& views, ThreadPool* pool,
                         double* cpu_seconds) {
  // The kernels' thread split (kernels.cc RunPlanImpl, whole jobs): one job
  // per (sequence, kv head), or a group of consecutive kv heads of one
  // sequence walked AttentionGroupChunkRows() rows at a time.
  struct Group {
    uint32_t view, head, n;
  };
  size_t n_jobs = 0;
  for (const LayerKvView& v : views) n_jobs += v.n_kv_heads;
  const uint32_t threads = pool ? pool->num_threads() : 1;
  std::vector<Group> groups;
  for (uint32_t i = 0; i < views.size(); ++i) {
    const uint32_t g = AttentionHeadsPerTask(views[i], n_jobs, threads);
    for (uint32_t h = 0; h < views[i].n_kv_heads; h += g) {
      groups.push_back({i, h, std::min(g, views[i].n_kv_heads - h)});
    }
  }
  const uint32_t group_rows = AttentionGroupChunkRows();
  const double c0 = ProcessCpuSeconds();
  const auto t0 = std::chrono::steady_clock::now();
  auto body = [&](uint32_t j, uint32_t) {
    const Group& gr = groups[j];
    const LayerKvView& v = views[gr.view];
    auto rows = [&](uint32_t h) { return v.head_len ? v.head_len[h] : v.num_tokens; };
    const uint32_t chunk = gr.n == 1 ? v.num_tokens : group_rows;
    uint64_t sum = 0;
    std::vector<Piece> pieces;
    for (const KvSideView* side : {&v.k, &v.v}) {
      pieces.clear();
      for (uint32_t c = 0; c < v.num_tokens; c += chunk) {
        for (uint32_t h = gr.head; h < gr.head + gr.n; ++h) {
          AddPieces(v, *side, h, c, std::min(rows(h), c + chunk), &pieces);
        }
      }
      sum += ReadPieces(pieces);
    }
    g_sink.fetch_add(sum, std::memory_order_relaxed);
  };
  if (pool) {
    pool->ParallelFor(static_cast<uint32_t>(groups.size()), body);
  } else {
    for (uint32_t j = 0; j < groups.size(); ++j) body(j, 0);
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (cpu_seconds) *cpu_seconds = (ProcessCpuSeconds() - c0) / threads;
  return s;
}

void ReadBandwidthProbe::Flush(size_t bytes) {
  const size_t n = std::min(data_.size(), bytes / sizeof(uint64_t));
  g_sink.fetch_add(ReadBytes(reinterpret_cast<const uint8_t*>(data_.data()), n * sizeof(uint64_t)), std::memory_order_relaxed);
}

}  // namespace kvcache::attention_internal
