// SIMD attention kernels over a Plan (plan.h), one Highway dispatch per call.
//
// Per job (one kv head of one sequence, nq query vectors) the work is three
// passes over the head's stored rows:
//   K pass:   s[qi][r] = scale * <q_qi, k_r> + bias_qi for visible rows,
//             -inf otherwise; running max per query vector.
//   exp pass: e[qi][r] = Exp(s - m) in place (Exp of reference.h, vectorized).
//   V pass:   per fixed 512-row segment: l += e_r, o[d] += e_r * v_r[d];
//             segments folded in order; out = o / l, then the value transforms.
// K and V rows are decoded 16 values at a time straight into registers
// (Decoder<F>) and consumed by up to 4 query vectors at once, so the decode
// of a row is shared by the q heads of a group and nothing is expanded to an
// f32 row in memory. The f32:f32 path without transforms ("exact") uses
// separate multiplies and adds in the order of reference.h, so it equals
// AttendReference bit for bit; every other path uses fused multiply-adds.
//
// Rows are walked as runs inside one block (HeadRows: one block-table read
// per block, not per row) with a software prefetch stream kPrefetchBytes
// ahead (Prefetcher: one prefetch per new cache line). When no row can be
// masked (no stored positions, no window, queries at or past the last row:
// plain decode) the passes skip every per-row visibility check.
//
// Parallelism: jobs run on the plan's pool, a job per task, or on paged
// f16/bf16/f32 views a group of up to 4 consecutive kv heads per task walked
// together 128 rows at a time (RunWhole, plan.h). When there are fewer jobs than
// twice the threads, each job's rows are split into chunks of whole segments
// (flash-decoding): K pass per chunk, a barrier, exp + V pass per chunk into
// per-segment partials, a barrier, then the in-order segment fold per job.
// The result is the same for every split.
//
// Profiling (RunPlanProfiled, for bench attention --passes): the same
// steps instantiated with kProfile = true read the clocks around each pass
// of each task (TaskTimer); with kProfile = false, RunPlan's instances, the
// timer is empty and compiles to nothing.
//
// Thread safety: scratch is thread_local; a Plan is only read.
//
// File layout: this file is the dispatch (one Highway dispatch per call) and
// the job-level steps (exp pass, segment fold, outputs, threading). The
// passes and decoders are per-target headers, instantiated one format family
// per file so the families compile in parallel:
//   kernel_common-inl.h   types, lookups, reductions, the row walk
//   kpass-inl.h           K pass (generic; asks IntKeyPass<F> first)
//   vpass-inl.h           V pass (generic; asks IntValuePass<F> first)
//   family-inl.h          a family's K/V passes and DecodeRow, by format
//   format/<family>/decode-inl.h (the decoders, shared with the codec) and
//   format/<family>/kpass-inl.h, vpass-inl.h (the family's integer paths):
//     plain    f32, f16, bf16             -> kernels_plain.cc
//     fp8_q8   fp8_e4m3, q8               -> kernels_fp8_q8.cc
//     ggml     q8_0, q4_0                 -> kernels_ggml.cc
//     turbo    turbo8/4/3/2, turbo4i/3i/2i -> kernels_turbo.cc
// The family of a format comes from the format table (format/traits.h).
#pragma GCC optimize("fp-contract=off")

// SSSE3 adds compile time and nothing over SSE4 for these kernels.
#ifndef HWY_DISABLED_TARGETS
#define HWY_DISABLED_TARGETS HWY_SSSE3
#endif
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "attention/kernels.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <time.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <mutex>
#include <vector>

#include "attention/kernel_common-inl.h"
#include "attention/plan.h"
#include "attention/reference.h"

HWY_BEFORE_NAMESPACE();
namespace kvcache {
namespace attention_internal {
namespace HWY_NAMESPACE {

// Vector Exp with exactly the operations of reference.h's Exp.
HWY_INLINE VF ExpV(VF x) {
  const DF df;
  const DI di;
  const auto ok = x >= hn::Set(df, kExpMin);
  x = hn::IfThenElseZero(ok, x);
  const VF t = hn::Mul(x, hn::Set(df, kLog2e));
  const VF magic = hn::Set(df, kRoundMagic);
  const VF n = hn::Sub(hn::Add(t, magic), magic);
  const VF a = hn::Mul(n, hn::Set(df, kLn2Hi));
  const VF r1 = hn::Sub(x, a);
  const VF b = hn::Mul(n, hn::Set(df, kLn2Lo));
  const VF r = hn::Sub(r1, b);
  VF p = hn::Set(df, kExpC6);
  p = hn::Mul(p, r);
  p = hn::Add(p, hn::Set(df, kExpC5));
  p = hn::Mul(p, r);
  p = hn::Add(p, hn::Set(df, kExpC4));
  p = hn::Mul(p, r);
  p = hn::Add(p, hn::Set(df, kExpC3));
  p = hn::Mul(p, r);
  p = hn::Add(p, hn::Set(df, kExpC2));
  p = hn::Mul(p, r);
  p = hn::Mul(p, r);
  p = hn::Add(p, r);
  p = hn::Add(p, hn::Set(df, 1.0f));
  const auto ni = hn::ConvertTo(di, n);
  const VF pow2 = hn::BitCast(df, hn::ShiftLeft<23>(hn::Add(ni, hn::Set(di, 127))));
  return hn::IfThenElseZero(ok, hn::Mul(p, pow2));
}


// ---------------------------------------------------------------------------
// Kernel selection (per job, by format family (format/traits.h); QB in
// {1, 2, 3, 4}).

struct FamilyFns {
  KFn (*k)(Format, bool, int);
  VFn (*v)(Format, bool, int);
  void (*decode)(Format, const uint8_t*, uint32_t, float*);
};

// By fi::Family.
constexpr FamilyFns kFamilyFns[fi::kNumFamilies] = {
    {&PlainK, &PlainV, &PlainDecode},  // plain
    {&Fp8Q8K, &Fp8Q8V, &Fp8Q8Decode},  // fp8_q8
    {&TurboK, &TurboV, &TurboDecode},  // turbo
    {&GgmlK, &GgmlV, &GgmlDecode},     // ggml
};
const FamilyFns& FamilyOf(Format f) { return kFamilyFns[static_cast<size_t>(fi::FamilyOf(f))]; }

KFn SelectK(const HeadJob& job, int qb) {
  if (job.exact) return PlainK(Format::kF32, true, qb);
  const Format f = job.view->k.format;
  return FamilyOf(f).k(f, false, qb);
}
VFn SelectV(const HeadJob& job, int qb) {
  if (job.exact) return PlainV(Format::kF32, true, qb);
  const Format f = job.view->v.format;
  return FamilyOf(f).v(f, false, qb);
}

// Query vectors a K or V pass call takes at once (its QB at most).
constexpr uint32_t kQueryBlock = 4;

// Calls fn(qi0, qb) over query blocks of 4, then one block of the 1 to 3
// left: a block decodes each stored row once for all its queries, so a GQA
// group of 3 (or 7 = 4 + 3) reads its rows once per block, not twice.
template <class Fn>
HWY_INLINE void ForQueryBlocks(uint32_t nq, const Fn& fn) {
  uint32_t qi = 0;
  for (; qi + kQueryBlock <= nq; qi += kQueryBlock) fn(qi, static_cast<int>(kQueryBlock));
  if (qi < nq) fn(qi, static_cast<int>(nq - qi));
}

// ---------------------------------------------------------------------------
// Pass timing (RunPlanProfiled only).

using Profile = AttentionPassProfile;

// *to += the pass times of from (rows not included).
void AddPassTimes(const Profile& from, Profile* to) {
  for (auto field : {&Profile::k, &Profile::exp, &Profile::v, &Profile::other}) {
    (to->*field).ticks += (from.*field).ticks;
    (to->*field).cpu_ns += (from.*field).cpu_ns;
  }
}

// The tasks' profiles, added together across threads (once per task).
struct ProfileSink {
  std::mutex mu;
  Profile sum;
  void Add(const Profile& p) {
    std::lock_guard<std::mutex> lock(mu);
    AddPassTimes(p, &sum);
  }
};

// One task's pass times: Lap(&Profile::k) adds the time since the last
// mark (the timer's construction or the previous Lap) to that pass and
// marks again, so a task's laps cover its whole time; the task's times go
// to the sink once, when the timer goes out of scope. Empty for kProfile
// false.
template <bool kProfile>
struct TaskTimer {
  explicit TaskTimer(ProfileSink*) {}
  HWY_INLINE void Lap(AttentionPassTime Profile::*) {}
};
template <>
struct TaskTimer<true> {
  explicit TaskTimer(ProfileSink* sink) : sink(sink) {
    cpu_ns = CpuNs();
    ticks = ReadTsc();
  }
  ~TaskTimer() { sink->Add(prof); }
  TaskTimer(const TaskTimer&) = delete;
  TaskTimer& operator=(const TaskTimer&) = delete;
  static uint64_t CpuNs() {
    timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return static_cast<uint64_t>(ts.tv_sec) * 1000000000u + static_cast<uint64_t>(ts.tv_nsec);
  }
  void Lap(AttentionPassTime Profile::*pass) {
    const uint64_t t1 = ReadTsc(), c1 = CpuNs();
    AttentionPassTime& t = prof.*pass;
    t.ticks += t1 - ticks;
    t.cpu_ns += c1 - cpu_ns;
    ticks = t1;
    cpu_ns = c1;
  }
  ProfileSink* sink;
  Profile prof;
  uint64_t ticks = 0, cpu_ns = 0;
};

// ---------------------------------------------------------------------------
// Job-level steps.

// pf (optional) is the walk's prefetch stream, stepped by the first query
// block only: the others read rows the first has just brought in. With
// several query blocks (a prefill chunk) the rows go a segment at a time,
// every block over one segment before the next: a segment of keys (512
// rows: 512 KiB of f32 at head_dim 256, 256 KiB of bf16) is read from
// memory once and from L2 by the other blocks, not once per block from
// memory. One block (decode) walks its range whole, one prefetch stream. The scores
// and maxima do not depend on the order (each score is its own row's dot
// products; a maximum is exact).
void RunK(const Plan& plan, const HeadJob& job, uint32_t r0, uint32_t r1, float* scores,
          float* maxes, Prefetcher* pf = nullptr) {
  const uint32_t tile = job.nq > kQueryBlock ? kSegmentRows : r1 - r0;
  for (uint32_t a = r0; a < r1; a += tile) {
    const uint32_t b = std::min(r1, a + tile);
    ForQueryBlocks(job.nq, [&](uint32_t qi0, int qb) {
      SelectK(job, qb)(KArgs{&plan, &job, qi0, a, b, scores, maxes, qi0 == 0 ? pf : nullptr});
    });
  }
}

void RunExp(const HeadJob& job, uint32_t r0, uint32_t r1, float* scores, const float* m) {
  const DF df;
  for (uint32_t qi = 0; qi < job.nq; ++qi) {
    if (m[qi] == kNegInf) continue;
    float* s = scores + static_cast<size_t>(qi) * job.rows;
    const VF mv = hn::Set(df, m[qi]);
    uint32_t r = r0;
    for (; r + kN <= r1; r += kN) hn::StoreU(ExpV(hn::Sub(hn::LoadU(df, s + r), mv)), df, s + r);
    for (; r < r1; ++r) s[r] = Exp(s[r] - m[qi]);
  }
}

// Rows [r0, r1) added into l[nq] and o[nq][pd]; pf as for RunK.
void RunV(const Plan& plan, const HeadJob& job, uint32_t r0, uint32_t r1, const float* e,
          float* l, float* o, Prefetcher* pf = nullptr) {
  ForQueryBlocks(job.nq, [&](uint32_t qi0, int qb) {
    SelectV(job, qb)(VArgs{&plan, &job, qi0, r0, r1, e, l, o, qi0 == 0 ? pf : nullptr});
  });
}

// Segment [r0, r1): partial sums into l[nq] (zeroed here) and o[nq][pd].
void RunVSegment(const Plan& plan, const HeadJob& job, uint32_t r0, uint32_t r1,
                 const float* e, float* l, float* o) {
  std::fill(l, l + job.nq, 0.0f);
  std::fill(o, o + static_cast<size_t>(job.nq) * plan.padded_dim, 0.0f);
  RunV(plan, job, r0, r1, e, l, o);
}

// total += part, elementwise (the segment fold).
void AddInto(float* total, const float* part, size_t n) {
  const DF df;
  size_t i = 0;
  for (; i + kN <= n; i += kN) {
    hn::StoreU(hn::Add(hn::LoadU(df, total + i), hn::LoadU(df, part + i)), df, total + i);
  }
  for (; i < n; ++i) total[i] = total[i] + part[i];
}

// Writes every output of the job from the folded sums. e: [nq][rows].
void Finalize(const Plan& plan, const HeadJob& job, const float* e, const float* m,
              const float* l, const float* o, float* tmp) {
  const LayerKvView& view = *job.view;
  const uint32_t d = plan.head_dim, pd = plan.padded_dim;
  const RowTransform* vt = view.v.transforms ? &view.v.transforms[job.head] : nullptr;
  const bool rotated = IsRotated(view.v.format);
  const float vmul = ValueMul(view.v.format);
  if (job.kv_probs) std::fill(job.kv_probs, job.kv_probs + view.num_tokens, 0.0f);
  for (uint32_t qi = 0; qi < job.nq; ++qi) {
    const QueryVec& q = plan.queries[job.first_query + qi];
    if (m[qi] == kNegInf) {
      std::fill(q.out, q.out + d, 0.0f);
      if (q.lse) *q.lse = kNegInf;
      if (q.probs) std::fill(q.probs, q.probs + view.num_tokens, 0.0f);
      continue;
    }
    const float lsum = l[qi];
    const float* oq = o + static_cast<size_t>(qi) * pd;
    for (uint32_t i = 0; i < d; ++i) tmp[i] = (oq[i] * vmul) / lsum;
    if (UsesNibbleOrder(view.v.format)) FromNibbleOrder(tmp, d);
    if (rotated) view.v.codec->InverseRotate(tmp);
    if (vt != nullptr && !vt->col_scale.empty()) {
      for (uint32_t i = 0; i < d; ++i) tmp[i] *= vt->col_scale[i];
    }
    if (vt != nullptr && !vt->mean.empty()) {
      for (uint32_t i = 0; i < d; ++i) tmp[i] += vt->mean[i];
    }
    std::memcpy(q.out, tmp, d * sizeof(float));
    if (q.lse) *q.lse = m[qi] + std::log(lsum);
    const float* eq = e + static_cast<size_t>(qi) * job.rows;
    if (q.probs) {
      for (uint32_t r = 0; r < job.rows; ++r) q.probs[r] = eq[r] / lsum;
      std::fill(q.probs + job.rows, q.probs + view.num_tokens, 0.0f);
    }
    if (job.kv_probs) {
      for (uint32_t r = 0; r < job.rows; ++r) job.kv_probs[r] = job.kv_probs[r] + eq[r] / lsum;
    }
  }
}

struct Scratch {
  std::vector<float> scores, m, l, o, l_seg, o_seg, tmp;
};
thread_local Scratch tls_scratch;
thread_local Scratch tls_whole_scratch[kGroupHeads];  // RunWhole's, one per head

// Whole jobs on one thread: one job, or n <= kGroupHeads jobs of
// consecutive kv heads of one sequence walked together (plan.h
// WalkHeadsGrouped): kGroupChunkRows rows at a time, head after head inside
// a chunk, one prefetch stream over that order per pass. At block 16 a
// head's piece of a block is 4 KiB (bf16, d = 128); walked one head after
// another, the pieces of a block are read far apart in time. Grouped, the
// bf16/f16 paged step took 0.81-0.88x the time (docs/attention.md). The
// results do not depend on the grouping, bit for bit: a chunk is whole V
// tiles inside one segment, and every sum still runs over the rows in
// order. kProfile: each pass timed into *sink (RunPlanProfiled).
template <bool kProfile>
void RunWhole(const Plan& plan, const HeadJob* jobs, uint32_t n, ProfileSink* sink) {
  TaskTimer<kProfile> timer(sink);
  Scratch* s = tls_whole_scratch;
  const size_t pd = plan.padded_dim;
  uint32_t ends[kGroupHeads];
  uint32_t max_rows = 0;
  for (uint32_t g = 0; g < n; ++g) {
    const HeadJob& job = jobs[g];
    const size_t nq = job.nq;
    s[g].scores.resize(std::max<size_t>(1, nq * job.rows));
    s[g].m.assign(nq, kNegInf);
    s[g].l.assign(nq, 0.0f);
    s[g].o.assign(nq * pd, 0.0f);
    s[g].l_seg.resize(nq);
    s[g].o_seg.resize(nq * pd);
    ends[g] = job.rows;
    max_rows = std::max(max_rows, job.rows);
  }
  s[0].tmp.resize(pd);
  const uint32_t chunk = n == 1 ? kSegmentRows : kGroupChunkRows;
  // fn(g, a, b) for each head's rows [a, b) of every chunk in [c0, c1), in
  // walk order; the prefetch stream over one side's rows in that order.
  auto walk = [&](uint32_t c0, uint32_t c1, const auto& fn) {
    for (uint32_t c = c0; c < c1; c += chunk) {
      for (uint32_t g = 0; g < n; ++g) {
        if (c < ends[g]) fn(g, c, std::min(ends[g], c + chunk));
      }
    }
  };
  HeadRows hr[kGroupHeads];
  auto stream = [&](bool keys) {
    for (uint32_t g = 0; g < n; ++g) {
      const LayerKvView& v = *jobs[g].view;
      hr[g] = HeadRows(v, keys ? v.k : v.v, jobs[g].head);
    }
    return Prefetcher(hr, ends, n, 0, chunk);
  };
  timer.Lap(&Profile::other);
  {
    Prefetcher pf = stream(true);
    walk(0, max_rows, [&](uint32_t g, uint32_t a, uint32_t b) {
      RunK(plan, jobs[g], a, b, s[g].scores.data(), s[g].m.data(), &pf);
    });
  }
  timer.Lap(&Profile::k);
  for (uint32_t g = 0; g < n; ++g) RunExp(jobs[g], 0, jobs[g].rows, s[g].scores.data(), s[g].m.data());
  timer.Lap(&Profile::exp);
  Prefetcher pf = stream(false);
  for (uint32_t r0 = 0; r0 < max_rows; r0 += kSegmentRows) {
    const uint32_t r1 = std::min(max_rows, r0 + kSegmentRows);
    for (uint32_t g = 0; g < n; ++g) {
      std::fill(s[g].l_seg.begin(), s[g].l_seg.end(), 0.0f);
      std::fill(s[g].o_seg.begin(), s[g].o_seg.end(), 0.0f);
    }
    walk(r0, r1, [&](uint32_t g, uint32_t a, uint32_t b) {
      RunV(plan, jobs[g], a, b, s[g].scores.data(), s[g].l_seg.data(), s[g].o_seg.data(), &pf);
    });
    for (uint32_t g = 0; g < n; ++g) {
      if (r0 >= ends[g]) continue;
      AddInto(s[g].l.data(), s[g].l_seg.data(), jobs[g].nq);
      AddInto(s[g].o.data(), s[g].o_seg.data(), jobs[g].nq * pd);
    }
  }
  timer.Lap(&Profile::v);
  for (uint32_t g = 0; g < n; ++g) {
    Finalize(plan, jobs[g], s[g].scores.data(), s[g].m.data(), s[g].l.data(), s[g].o.data(),
             s[0].tmp.data());
  }
  timer.Lap(&Profile::other);
}

void ParallelFor(ThreadPool* pool, uint32_t n, const ThreadPool::Task& fn) {
  if (pool == nullptr) {
    for (uint32_t i = 0; i < n; ++i) fn(i, 0);
  } else {
    pool->ParallelFor(n, fn);
  }
}

// How RunSplit cuts the plan's jobs (flash-decoding): each job's rows into
// chunks of whole segments, one task per (job, chunk), over buffers shared
// by all jobs: scores [nq][rows], each chunk's running maxima [chunks][nq]
// and each segment's partial sums [segments][nq][1 + padded_dim] (l, then
// o), at the job's offsets.
struct JobSplit {
  uint32_t segments, seg_per_chunk, chunks;
  size_t scores_off, max_off, part_off;
};
struct SplitItem {
  uint32_t job, chunk;
};
struct Split {
  std::vector<JobSplit> jobs;  // [plan.jobs.size()]
  std::vector<SplitItem> items;
  float* scores = nullptr;
  float* maxes = nullptr;
  float* parts = nullptr;

  // Rows [*r0, *r1) of chunk c of job j.
  void Rows(const Plan& plan, uint32_t j, uint32_t c, uint32_t* r0, uint32_t* r1) const {
    const JobSplit& js = jobs[j];
    *r0 = c * js.seg_per_chunk * kSegmentRows;
    *r1 = std::min(plan.jobs[j].rows, (c + 1) * js.seg_per_chunk * kSegmentRows);
  }
  // Segment seg's partial sums of job j.
  float* Part(const Plan& plan, uint32_t j, uint32_t seg) const {
    return parts + jobs[j].part_off +
           static_cast<size_t>(seg) * plan.jobs[j].nq * (plan.padded_dim + 1);
  }
  // m[qi] = the maximum over job j's chunks of their running maxima.
  void FoldMaxes(const Plan& plan, uint32_t j, std::vector<float>* m) const {
    const JobSplit& js = jobs[j];
    const uint32_t nq = plan.jobs[j].nq;
    m->assign(nq, kNegInf);
    for (uint32_t c = 0; c < js.chunks; ++c) {
      for (uint32_t qi = 0; qi < nq; ++qi) {
        (*m)[qi] = std::max((*m)[qi], maxes[js.max_off + static_cast<size_t>(c) * nq + qi]);
      }
    }
  }
};

// The split for chunks_wanted chunks per job (fewer for short jobs), its
// buffers the calling thread's (thread_local, reused across calls).
Split MakeSplit(const Plan& plan, uint32_t chunks_wanted) {
  Split sp;
  sp.jobs.resize(plan.jobs.size());
  size_t scores_n = 0, max_n = 0, part_n = 0;
  for (uint32_t j = 0; j < plan.jobs.size(); ++j) {
    const HeadJob& job = plan.jobs[j];
    JobSplit& js = sp.jobs[j];
    js.segments = std::max<uint32_t>(1, (job.rows + kSegmentRows - 1) / kSegmentRows);
    const uint32_t c = std::min(js.segments, std::max<uint32_t>(1, chunks_wanted));
    js.seg_per_chunk = (js.segments + c - 1) / c;
    js.chunks = (js.segments + js.seg_per_chunk - 1) / js.seg_per_chunk;
    js.scores_off = scores_n;
    js.max_off = max_n;
    js.part_off = part_n;
    scores_n += static_cast<size_t>(job.nq) * job.rows;
    max_n += static_cast<size_t>(job.nq) * js.chunks;
    part_n += static_cast<size_t>(job.nq) * (plan.padded_dim + 1) * js.segments;
    for (uint32_t c2 = 0; c2 < js.chunks; ++c2) sp.items.push_back({j, c2});
  }
  thread_local std::vector<float> scores, maxes, parts;
  scores.resize(std::max<size_t>(1, scores_n));
  maxes.assign(max_n, kNegInf);
  parts.resize(std::max<size_t>(1, part_n));
  sp.scores = scores.data();
  sp.maxes = maxes.data();
  sp.parts = parts.data();
  return sp;
}

// Task `item` of the first step: the K pass over its chunk.
template <bool kProfile>
void SplitK(const Plan& plan, const Split& sp, uint32_t item, ProfileSink* sink) {
  TaskTimer<kProfile> timer(sink);
  const SplitItem it = sp.items[item];
  const HeadJob& job = plan.jobs[it.job];
  const JobSplit& js = sp.jobs[it.job];
  uint32_t r0, r1;
  sp.Rows(plan, it.job, it.chunk, &r0, &r1);
  RunK(plan, job, r0, r1, sp.scores + js.scores_off,
       sp.maxes + js.max_off + static_cast<size_t>(it.chunk) * job.nq);
  timer.Lap(&Profile::k);
}

// Task `item` of the second step: exp and the V pass over its chunk, into
// its segments' partial sums.
template <bool kProfile>
void SplitExpV(const Plan& plan, const Split& sp, uint32_t item, ProfileSink* sink) {
  TaskTimer<kProfile> timer(sink);
  const SplitItem it = sp.items[item];
  const HeadJob& job = plan.jobs[it.job];
  Scratch& s = tls_scratch;
  sp.FoldMaxes(plan, it.job, &s.m);
  uint32_t r0, r1;
  sp.Rows(plan, it.job, it.chunk, &r0, &r1);
  float* e = sp.scores + sp.jobs[it.job].scores_off;
  RunExp(job, r0, r1, e, s.m.data());
  timer.Lap(&Profile::exp);
  for (uint32_t seg = r0 / kSegmentRows; seg * kSegmentRows < r1; ++seg) {
    float* part = sp.Part(plan, it.job, seg);
    RunVSegment(plan, job, seg * kSegmentRows, std::min(r1, (seg + 1) * kSegmentRows), e,
                part, part + job.nq);
  }
  timer.Lap(&Profile::v);
}

// Job j of the last step: its segments' partial sums folded in order, then
// its outputs.
template <bool kProfile>
void SplitFold(const Plan& plan, const Split& sp, uint32_t j, ProfileSink* sink) {
  TaskTimer<kProfile> timer(sink);
  const HeadJob& job = plan.jobs[j];
  const size_t pd = plan.padded_dim;
  Scratch& s = tls_scratch;
  sp.FoldMaxes(plan, j, &s.m);
  s.l.assign(job.nq, 0.0f);
  s.o.assign(static_cast<size_t>(job.nq) * pd, 0.0f);
  s.tmp.resize(pd);
  const uint32_t segs_with_rows = (job.rows + kSegmentRows - 1) / kSegmentRows;
  for (uint32_t seg = 0; seg < segs_with_rows; ++seg) {
    const float* part = sp.Part(plan, j, seg);
    AddInto(s.l.data(), part, job.nq);
    AddInto(s.o.data(), part + job.nq, static_cast<size_t>(job.nq) * pd);
  }
  Finalize(plan, job, sp.scores + sp.jobs[j].scores_off, s.m.data(), s.l.data(), s.o.data(),
           s.tmp.data());
  timer.Lap(&Profile::other);
}

// Jobs split into chunks of whole segments (flash-decoding): the K pass per
// chunk, a barrier, exp and the V pass per chunk, a barrier, the fold per
// job. kProfile: as for RunWhole.
template <bool kProfile>
void RunSplit(const Plan& plan, uint32_t chunks_wanted, ProfileSink* sink) {
  Split sp;
  {
    TaskTimer<kProfile> setup(sink);
    sp = MakeSplit(plan, chunks_wanted);
    setup.Lap(&Profile::other);
  }
  const uint32_t n_items = static_cast<uint32_t>(sp.items.size());
  ParallelFor(plan.pool, n_items,
              [&](uint32_t i, uint32_t) { SplitK<kProfile>(plan, sp, i, sink); });
  ParallelFor(plan.pool, n_items,
              [&](uint32_t i, uint32_t) { SplitExpV<kProfile>(plan, sp, i, sink); });
  ParallelFor(plan.pool, static_cast<uint32_t>(plan.jobs.size()),
              [&](uint32_t j, uint32_t) { SplitFold<kProfile>(plan, sp, j, sink); });
}

template <bool kProfile>
void RunPlanT(const Plan& plan, ProfileSink* sink) {
  const uint32_t threads = plan.pool ? plan.pool->num_threads() : 1;
  const uint32_t n_jobs = static_cast<uint32_t>(plan.jobs.size());
  if (threads == 1 || n_jobs >= 2 * threads) {
    // Tasks: runs of up to HeadsPerTask (plan.h) jobs of consecutive kv
    // heads of one view; a job alone where the view is not grouped.
    std::vector<uint32_t> starts;
    for (uint32_t j = 0; j < n_jobs;) {
      starts.push_back(j);
      const LayerKvView* v = plan.jobs[j].view;
      const uint32_t group = HeadsPerTask(*v, n_jobs, threads);
      uint32_t k = j + 1;
      while (k < n_jobs && k - j < group && plan.jobs[k].view == v &&
             plan.jobs[k].head == plan.jobs[k - 1].head + 1) {
        ++k;
      }
      j = k;
    }
    starts.push_back(n_jobs);
    ParallelFor(plan.pool, static_cast<uint32_t>(starts.size() - 1), [&](uint32_t i, uint32_t) {
      RunWhole<kProfile>(plan, plan.jobs.data() + starts[i], starts[i + 1] - starts[i], sink);
    });
    return;
  }
  RunSplit<kProfile>(plan, (2 * threads + n_jobs - 1) / n_jobs, sink);
}

void RunPlanImpl(const Plan& plan) { RunPlanT<false>(plan, nullptr); }

void RunPlanProfiledImpl(const Plan& plan, AttentionPassProfile* profile) {
  ProfileSink sink;
  RunPlanT<true>(plan, &sink);
  AddPassTimes(sink.sum, profile);
  for (const HeadJob& job : plan.jobs) profile->rows += job.rows;
}

// Exposed for tests: the vector Exp on a buffer.
void ExpBuffer(float* x, size_t n) {
  const DF df;
  size_t i = 0;
  for (; i + kN <= n; i += kN) hn::StoreU(ExpV(hn::LoadU(df, x + i)), df, x + i);
  for (; i < n; ++i) x[i] = Exp(x[i]);
}

// Exposed for tests: the kernels' E4M3 decode, 16 codes at a time.
void E4M3Decode(const uint8_t* codes, size_t n, float* out) {
  const VF m = hn::Set(DF(), kE4M3BlockMul);
  for (size_t i = 0; i + kDotLanes <= n; i += kDotLanes) {
    VF v[kVecs];
    E4M3Block(codes + i, v);
    for (size_t j = 0; j < kVecs; ++j) hn::StoreU(hn::Mul(v[j], m), DF(), out + i + j * kN);
  }
}


// Exposed for tests: a row decoded as the kernels consume it (DecodeRow).
void DecodeRowKernel(Format f, const uint8_t* row, uint32_t d, float* out) {
  FamilyOf(f).decode(f, row, d, out);
}

}  // namespace HWY_NAMESPACE
}  // namespace attention_internal
}  // namespace kvcache
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kvcache {
namespace attention_internal {
HWY_EXPORT(RunPlanImpl);
HWY_EXPORT(RunPlanProfiledImpl);
HWY_EXPORT(ExpBuffer);
HWY_EXPORT(E4M3Decode);
HWY_EXPORT(DecodeRowKernel);

void RunPlan(const Plan& plan) { HWY_DYNAMIC_DISPATCH(RunPlanImpl)(plan); }
void RunPlanProfiled(const Plan& plan, AttentionPassProfile* profile) {
  HWY_DYNAMIC_DISPATCH(RunPlanProfiledImpl)(plan, profile);
}
void ExpBufferForTest(float* x, size_t n) { HWY_DYNAMIC_DISPATCH(ExpBuffer)(x, n); }
void E4M3DecodeForTest(const uint8_t* codes, size_t n, float* out) {
  HWY_DYNAMIC_DISPATCH(E4M3Decode)(codes, n, out);
}
void DecodeRowForTest(Format format, const uint8_t* row, uint32_t head_dim, float* out) {
  HWY_DYNAMIC_DISPATCH(DecodeRowKernel)(format, row, head_dim, out);
}
}  // namespace attention_internal
}  // namespace kvcache
#endif
