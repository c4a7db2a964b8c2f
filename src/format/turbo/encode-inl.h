// SIMD encoder of the turbo formats (see turbo.h): turbo4/3/2 (and their
// integer-level forms turbo4i/3i/2i) work on 8
// (AVX2, AVX3) or 4 (SSE4, EMU128) groups at a time (SCALAR: the reference):
// the groups' rows are transposed in registers (group = lane), the scale
// search runs on |x| (QuantizeTurboBatch says why that is exact) without
// dividing (LevelTable's |x|-space thresholds), and the codes are packed into
// words in registers. Per-group choices that sum errors keep one group per
// SIMD lane, so each lane runs the scalar sequence of operations.
//
// A fragment of codec_simd.cc, which includes it inside namespace
// kvcache::format_internal::HWY_NAMESPACE once per target, after the shared
// conversions; no other file includes it.

// The SCALAR target (one lane) uses the scalar reference for turbo4/3/2.
#if HWY_TARGET != HWY_SCALAR

// DT: 8 lanes where the target has them (AVX2, AVX3), else 4 (SSE4, EMU128).
using DT = hn::CappedTag<float, 8>;
using DTI = hn::RebindToSigned<DT>;
using DTU = hn::RebindToUnsigned<DT>;
using VT = hn::Vec<DT>;
using VTI = hn::Vec<DTI>;
using VTU = hn::Vec<DTU>;
constexpr size_t kTL = hn::MaxLanes(DT());
static_assert(kTL == 4 || kTL == 8, "turbo encoder: 4 or 8 lanes");

// In-register transpose of kTL rows of kTL floats: out[c] lane r = rows[r][c].
HWY_INLINE void Transpose(const VT* r, VT* out) {
  const DT d;
  const hn::Repartition<uint64_t, DT> d64;
  auto lo64 = [&](VT a, VT b) {
    return hn::BitCast(d, hn::InterleaveLower(d64, hn::BitCast(d64, a), hn::BitCast(d64, b)));
  };
  auto hi64 = [&](VT a, VT b) {
    return hn::BitCast(d, hn::InterleaveUpper(d64, hn::BitCast(d64, a), hn::BitCast(d64, b)));
  };
  // 4x4 within each 128-bit block of rows [base, base + 4).
  auto block4 = [&](size_t base, VT* c) {
    const VT t0 = hn::InterleaveLower(d, r[base + 0], r[base + 1]);
    const VT t1 = hn::InterleaveLower(d, r[base + 2], r[base + 3]);
    const VT t2 = hn::InterleaveUpper(d, r[base + 0], r[base + 1]);
    const VT t3 = hn::InterleaveUpper(d, r[base + 2], r[base + 3]);
    c[0] = lo64(t0, t1);
    c[1] = hi64(t0, t1);
    c[2] = lo64(t2, t3);
    c[3] = hi64(t2, t3);
  };
  if constexpr (kTL == 4) {
    block4(0, out);
  } else {
    VT a[4], b[4];
    block4(0, a);  // block 0: columns 0..3 of rows 0..3; block 1: columns 4..7
    block4(4, b);
    for (size_t c = 0; c < 4; ++c) {
      out[c] = hn::ConcatLowerLower(d, b[c], a[c]);
      out[c + 4] = hn::ConcatUpperUpper(d, b[c], a[c]);
    }
  }
}

// Lanes of an 8-entry table picked by idx (only its low 3 bits count).
HWY_INLINE VT Lookup8(const float* tab8, VTI idx) {
  const DT d;
  const DTI di;
#if HWY_TARGET == HWY_AVX2 || HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
  (void)di;
  return VT{_mm256_permutevar8x32_ps(hn::Load(d, tab8).raw, idx.raw)};  // vpermps
#else
  if constexpr (kTL == 8) {
    return hn::TableLookupLanes(hn::Load(d, tab8), hn::IndicesFromVec(d, hn::And(idx, hn::Set(di, 7))));
  } else {
    const auto ix = hn::IndicesFromVec(d, hn::And(idx, hn::Set(di, 3)));
    const VT lo = hn::TableLookupLanes(hn::Load(d, tab8), ix);
    const VT hi = hn::TableLookupLanes(hn::Load(d, tab8 + 4), ix);
    const auto upper = hn::RebindMask(d, hn::TestBit(idx, hn::Set(di, 4)));
    return hn::IfThenElse(upper, hi, lo);
  }
#endif
}

// The scale's thresholds in |x| space (see LevelTable): thr[j] lane g =
// abs_thr[j][mantissa of s] * 2^exponent of s.
template <size_t L>
HWY_INLINE void AbsThresholds(const LevelTable<L>& t, VT s, VT* thr) {
  const DT d;
  const DTI di;
  const VTI bits = hn::BitCast(di, s);
  const VTI m = hn::ShiftRight<20>(bits);  // the exponent above bit 3 is ignored by Lookup8
  // Times 2^E as an add to the exponent field (exact: the product is normal).
  const VTI e = hn::Sub(hn::And(bits, hn::Set(di, 0x7F800000)), hn::Set(di, 127 << 23));
  for (size_t j = 0; j < LevelTable<L>::kT; ++j) {
    thr[j] = hn::BitCast(d, hn::Add(hn::BitCast(di, Lookup8(t.abs_thr[j], m)), e));
  }
}

// The non-negative level nearest to fl(a / s), from the scale's |x|-space
// thresholds: 8 lanes count the thresholds below a and look the level up
// (turbo4, turbo3); 4 lanes and turbo2 run a select chain.
template <size_t L>
HWY_INLINE VT AbsLevel(const LevelTable<L>& t, const VT* thr, VT a) {
  const DT d;
  const DTI di;
  constexpr size_t kT = LevelTable<L>::kT;
  if constexpr (kTL == 8 && L >= 8) {
    // Integer compares of the bits (non-negative floats order as their bits;
    // they issue on more pipes than float compares). A NaN a compares above
    // every threshold here and below them in the scalar code; its error is
    // NaN with any level, so the choice of scale is the same.
    const VTI ai = hn::BitCast(di, a);
    VTI sum = hn::VecFromMask(di, ai > hn::BitCast(di, thr[0]));
    for (size_t j = 1; j < kT; ++j) sum = hn::Add(sum, hn::VecFromMask(di, ai > hn::BitCast(di, thr[j])));
    return Lookup8(t.perm_level, sum);
  } else {
    VT lv = hn::Set(d, t.level[L / 2]);
    for (size_t j = 0; j < kT; ++j) lv = hn::IfThenElse(a > thr[j], hn::Set(d, t.level[L / 2 + j + 1]), lv);
    return lv;
  }
}

// Level of the nearest code for y = |x| / s (the quotient itself): a select
// chain over the shared thresholds. 4-lane targets use it for turbo4, where
// building the |x|-space thresholds (8-entry lookups in two halves) costs more
// than the divisions (measured).
template <size_t L>
HWY_INLINE VT AbsLevelOfQuotient(const LevelTable<L>& t, VT y) {
  const DT d;
  VT lv = hn::Set(d, t.level[L / 2]);
  for (size_t j = 0; j < LevelTable<L>::kT; ++j) {
    lv = hn::IfThenElse(y > hn::Set(d, t.threshold[j]), hn::Set(d, t.level[L / 2 + j + 1]), lv);
  }
  return lv;
}

template <size_t L>
constexpr bool ByQuotient() {
  return kTL == 4 && L == 16;
}

// The search's nearest non-negative level for a = |x| under scale s, given
// AbsThresholds(s) (unused where ByQuotient).
template <size_t L>
HWY_INLINE VT SearchLevel(const LevelTable<L>& t, const VT* thr, VT a, VT s) {
  if constexpr (ByQuotient<L>()) {
    (void)thr;
    return AbsLevelOfQuotient(t, hn::Div(a, s));
  } else {
    (void)s;
    return AbsLevel(t, thr, a);
  }
}

template <size_t L>
void TurboSearchLevelsOf(const LevelTable<L>& t, size_t n, const float* a, const float* s, float* level) {
  const DT d;
  alignas(64) float pa[kTL], ps[kTL], pl[kTL];
  for (size_t i = 0; i < n; i += kTL) {
    const size_t cnt = std::min(kTL, n - i);
    std::fill(pa, pa + kTL, 0.0f);
    std::fill(ps, ps + kTL, 1.0f);
    std::copy(a + i, a + i + cnt, pa);
    std::copy(s + i, s + i + cnt, ps);
    const VT vs = hn::Load(d, ps);
    VT thr[LevelTable<L>::kT];
    if constexpr (!ByQuotient<L>()) AbsThresholds(t, vs, thr);
    hn::Store(SearchLevel(t, thr, hn::Load(d, pa), vs), d, pl);
    std::copy(pl, pl + cnt, level + i);
  }
}

// NearestCode of y = x / s, exactly as turbo/scalar.cc (sign of y decides the half).
template <size_t L>
HWY_INLINE VTI CodesOf(const LevelTable<L>& t, VT y) {
  const DT d;
  const DTI di;
  const VT a = hn::Abs(y);
  VTI c = hn::Zero(di);
  for (size_t j = 0; j < LevelTable<L>::kT; ++j) {
    c = hn::Sub(c, hn::VecFromMask(di, hn::RebindMask(di, a > hn::Set(d, t.threshold[j]))));
  }
  const auto pos = hn::RebindMask(di, y > hn::Zero(d));
  constexpr int32_t kHalf = static_cast<int32_t>(L / 2);
  return hn::IfThenElse(pos, hn::Add(hn::Set(di, kHalf), c), hn::Sub(hn::Set(di, kHalf - 1), c));
}

// One batch of kTL groups, v[i] lane g = value i of group g, a[i] = |v[i]|.
// Picks each lane's scale code (as QuantizeTurboGroup) and the 16 codes.
//
// The candidates' errors use |x| and the non-negative level: the scalar
// x - s * level(x / s) is the exact negation of that (division, products and
// the subtraction are sign-symmetric, the codebook is symmetric), so the
// squares are equal, except where the scalar code's sign choice differs: x > 0
// whose quotient rounds to +0, which then takes the negative level. That needs
// x <= s * 2^-150 <= 448 * 2^-150 < 2^-141, while s * level >= 2^-9 * 0.0507
// (the smallest scale and level) has a half-ulp above 2^-39, so x + s * l and
// x - s * l both round to +-(s * l): the squares are equal there too. In the
// search the nearest level comes from |x|-space thresholds (no division, see
// LevelTable; turbo4 on 4 lanes divides); the final codes divide, as the scalar code.
template <size_t L>
HWY_INLINE void QuantizeTurboBatch(const LevelTable<L>& t, const VT* v, const VT* a, VT amax,
                                   VTI* scale_code, VTI* codes) {
  const DT d;
  const DTI di;
  constexpr int kC = 2 * kTurboScaleSearch + 1;  // candidates c0-2 .. c0+2
  constexpr size_t kT = LevelTable<L>::kT;
  const VTI c0 = EncodeE4M3T(d, amax);
  VTI cc[kC];
  VT s[kC], err[kC], thr[kC][kT];
  constexpr bool kByQuotient = ByQuotient<L>();
  for (int k = 0; k < kC; ++k) {
    const VTI c = hn::Add(c0, hn::Set(di, k - kTurboScaleSearch));
    cc[k] = hn::Min(hn::Max(c, hn::Set(di, 1)), hn::Set(di, 0x7E));
    s[k] = DecodeE4M3T(d, cc[k]);
    if constexpr (!kByQuotient) AbsThresholds(t, s[k], thr[k]);
    err[k] = hn::Zero(d);
  }
  // The candidates' error sums run side by side (each in the scalar order
  // over i): five independent add chains instead of one after another.
  for (int i = 0; i < 16; ++i) {
    for (int k = 0; k < kC; ++k) {
      const VT lv = SearchLevel(t, thr[k], a[i], s[k]);
      const VT dd = hn::Sub(a[i], hn::Mul(s[k], lv));
      err[k] = hn::Add(err[k], hn::Mul(dd, dd));
    }
  }
  VTI best_c = cc[0];
  VT best_err = hn::Set(d, std::numeric_limits<float>::infinity());
  for (int k = 0; k < kC; ++k) {
    const VTI c = hn::Add(c0, hn::Set(di, k - kTurboScaleSearch));
    const auto valid = hn::And(c > hn::Zero(di), hn::Set(di, 0x7F) > c);
    const auto better = hn::And(valid, hn::RebindMask(di, err[k] < best_err));
    best_c = hn::IfThenElse(better, cc[k], best_c);
    best_err = hn::IfThenElse(hn::RebindMask(d, better), err[k], best_err);
  }
  const auto zero = hn::RebindMask(di, amax == hn::Zero(d));
  const VT sb = DecodeE4M3T(d, best_c);
  *scale_code = hn::IfThenZeroElse(zero, best_c);
  for (int i = 0; i < 16; ++i) codes[i] = hn::IfThenZeroElse(zero, CodesOf(t, hn::Div(v[i], sb)));
}

// Packs the 16 codes of each lane into its group's code bytes, as little-endian
// words: lo = bytes [0, 4), hi = bytes [4, 8) (turbo4) or [4, 6) (turbo3);
// turbo3i: lo = the low 2 bits (turbo2's word), hi = the bit-2 word.
HWY_INLINE void PackWords(Format f, const VTI* k, VTU* lo, VTU* hi) {
  const DTU du;
  auto u = [&](int i) { return hn::BitCast(du, k[i]); };
  VTU a = hn::Zero(du), b = hn::Zero(du);
  if (f == Format::kTurbo4 || f == Format::kTurbo4I) {
    for (int i = 0; i < 8; ++i) {
      a = hn::Or(a, hn::ShiftLeftSame(u(i), 4 * i));
      b = hn::Or(b, hn::ShiftLeftSame(u(i + 8), 4 * i));
    }
  } else if (f == Format::kTurbo3) {
    for (int i = 0; i <= 10; ++i) a = hn::Or(a, hn::ShiftLeftSame(u(i), 3 * i));  // k10: low 2 bits
    b = hn::ShiftRight<2>(u(10));
    for (int i = 11; i < 16; ++i) b = hn::Or(b, hn::ShiftLeftSame(u(i), 3 * i - 32));
  } else if (f == Format::kTurbo3I) {
    const VTU three = hn::Set(du, 3u);
    for (int i = 0; i < 16; ++i) {
      a = hn::Or(a, hn::ShiftLeftSame(hn::And(u(i), three), 2 * i));
      b = hn::Or(b, hn::ShiftLeftSame(hn::ShiftRight<2>(u(i)), i));  // codes < 8: bit 2 alone
    }
  } else {
    for (int i = 0; i < 16; ++i) a = hn::Or(a, hn::ShiftLeftSame(u(i), 2 * i));
  }
  *lo = a;
  *hi = b;
}

// Groups [g0, g0 + kTL) of x (those at or past `groups` read as zeros),
// transposed: v[i] lane g = value i of group g0 + g.
HWY_INLINE void LoadGroupBatch(const float* x, size_t g0, size_t groups, VT* v) {
  const DT dt;
  alignas(64) float pad[16 * kTL];
  const size_t cnt = std::min(kTL, groups - g0);
  const float* src = x + g0 * 16;
  if (cnt < kTL) {
    std::fill(pad, pad + 16 * kTL, 0.0f);
    std::memcpy(pad, src, cnt * 16 * sizeof(float));
    src = pad;
  }
  for (size_t q = 0; q < 16 / kTL; ++q) {
    VT r[kTL];
    for (size_t g = 0; g < kTL; ++g) r[g] = hn::LoadU(dt, src + 16 * g + q * kTL);
    Transpose(r, v + q * kTL);
  }
}

// The row and the group inside it of consecutive groups of a row batch.
struct GroupCursor {
  size_t groups_per_row, row = 0, group = 0;
  void Next() {
    if (++group == groups_per_row) {
      group = 0;
      ++row;
    }
  }
};

template <size_t L>
void EncodeTurboRows(const LevelTable<L>& t, Format f, uint32_t d, size_t n, const float* x,
                     uint8_t* out) {
  const RowLayout l = LayoutOf(f, d);
  const size_t rb = RowBytes(f, d);
  const size_t groups = n * (d / 16);
  const size_t code_bytes = l.group_code_bytes;
  alignas(64) uint32_t wlo[kTL], whi[kTL];
  alignas(64) int32_t sc[kTL];
  GroupCursor at{d / 16};  // of group g0
  for (size_t g0 = 0; g0 < groups; g0 += kTL) {
    VT v[16], a[16];
    LoadGroupBatch(x, g0, groups, v);
    VT amax = hn::Zero(DT());
    for (int i = 0; i < 16; ++i) {
      a[i] = hn::Abs(v[i]);
      amax = hn::Max(amax, a[i]);
    }
    VTI scale_code, codes[16];
    QuantizeTurboBatch(t, v, a, amax, &scale_code, codes);
    VTU lo, hi;
    PackWords(f, codes, &lo, &hi);
    hn::Store(lo, DTU(), wlo);
    hn::Store(hi, DTU(), whi);
    hn::Store(scale_code, DTI(), sc);
    for (size_t g = 0; g < std::min(kTL, groups - g0); ++g, at.Next()) {
      uint8_t* o = out + at.row * rb;
      if (f == Format::kTurbo3I) {  // two planes (turbo.h)
        std::memcpy(o + 4 * at.group, &wlo[g], 4);  // little-endian host (see codec_simd.cc)
        std::memcpy(o + d / 4 + 2 * at.group, &whi[g], 2);
      } else {
        uint8_t* dst = o + at.group * code_bytes;
        std::memcpy(dst, &wlo[g], 4);  // little-endian host (see codec_simd.cc)
        if (code_bytes > 4) std::memcpy(dst + 4, &whi[g], code_bytes - 4);
      }
      o[l.scales_offset + at.group] = static_cast<uint8_t>(sc[g]);
    }
  }
}

// Turbo8 on 8-lane targets, 8 groups at a time (transposed as above): each
// lane's bf16 scale amax / 448 and 16 E4M3 codes of x / scale, as
// turbo/scalar.cc; the codes packed four to a little-endian word in registers.
void EncodeTurbo8Batches(uint32_t d, size_t n, const float* x, uint8_t* out) {
  const DT dt;
  const DTI di;
  const DTU du;
  const RowLayout l = LayoutOf(Format::kTurbo8, d);
  const size_t rb = RowBytes(Format::kTurbo8, d);
  const size_t groups = n * (d / 16);
  alignas(64) uint32_t w[4][kTL];
  alignas(64) int32_t sc[kTL];
  GroupCursor at{d / 16};  // of group g0
  for (size_t g0 = 0; g0 < groups; g0 += kTL) {
    VT v[16];
    LoadGroupBatch(x, g0, groups, v);
    VT amax = hn::Zero(dt);
    for (int i = 0; i < 16; ++i) amax = hn::Max(amax, hn::Abs(v[i]));
    const VTI sb = EncodeBF16T(dt, hn::Div(amax, hn::Set(dt, kE4M3Max)));
    const VT s = hn::BitCast(dt, hn::ShiftLeft<16>(sb));
    const auto zero = hn::RebindMask(di, s == hn::Zero(dt));  // codes 0 (x / 0 is discarded)
    VTU words[4] = {hn::Zero(du), hn::Zero(du), hn::Zero(du), hn::Zero(du)};
    for (int i = 0; i < 16; ++i) {
      const VTI c = hn::IfThenZeroElse(zero, EncodeE4M3T(dt, hn::Div(v[i], s)));
      words[i / 4] = hn::Or(words[i / 4], hn::ShiftLeftSame(hn::BitCast(du, c), 8 * (i % 4)));
    }
    for (int j = 0; j < 4; ++j) hn::Store(words[j], du, w[j]);
    hn::Store(sb, di, sc);
    for (size_t g = 0; g < std::min(kTL, groups - g0); ++g, at.Next()) {
      uint8_t* o = out + at.row * rb;
      uint8_t* dst = o + at.group * 16;
      for (int j = 0; j < 4; ++j) std::memcpy(dst + 4 * j, &w[j][g], 4);  // little-endian host
      StoreU16(static_cast<uint16_t>(sc[g]), o + l.scales_offset + 2 * at.group);
    }
  }
}

#endif  // HWY_TARGET != HWY_SCALAR

// Turbo8 one group at a time (4-lane and 1-lane targets: 4 lanes measured no
// faster in transposed batches).
void EncodeTurbo8Groups(uint32_t d, size_t n, const float* HWY_RESTRICT x, uint8_t* HWY_RESTRICT out) {
  const DF df;
  const RowLayout l = LayoutOf(Format::kTurbo8, d);
  const size_t rb = RowBytes(Format::kTurbo8, d);
  for (size_t r = 0; r < n; ++r) {
    for (uint32_t g = 0; g < d / 16; ++g) {
      const float* xg = x + r * d + 16 * g;
      uint8_t* o = out + r * rb;
      const uint16_t sb = FloatToBF16(MaxAbs(xg, 16) / kE4M3Max);
      const float s = BF16ToFloat(sb);
      if (s == 0.0f) {
        std::memset(o + 16 * g, 0, 16);
      } else {
        const VF vs = hn::Set(df, s);
        for (size_t i = 0; i < 16; i += kN) {
          StoreI32AsU8(EncodeE4M3(hn::Div(hn::LoadU(df, xg + i), vs)), o + 16 * g + i);
        }
      }
      StoreU16(sb, o + l.scales_offset + 2 * g);
    }
  }
}

// The rows of turbo format f.
void EncodeTurboRowsOf(Format f, uint32_t d, size_t n, const float* HWY_RESTRICT x,
                       uint8_t* HWY_RESTRICT out) {
#if HWY_TARGET != HWY_SCALAR
  switch (f) {
    case Format::kTurbo8:
      if constexpr (kTL == 8) return EncodeTurbo8Batches(d, n, x, out);
      return EncodeTurbo8Groups(d, n, x, out);
    case Format::kTurbo4: return EncodeTurboRows(Turbo4Table(), f, d, n, x, out);
    case Format::kTurbo4I: return EncodeTurboRows(Turbo4ITable(), f, d, n, x, out);
    case Format::kTurbo3: return EncodeTurboRows(Turbo3Table(), f, d, n, x, out);
    case Format::kTurbo3I: return EncodeTurboRows(Turbo3ITable(), f, d, n, x, out);
    case Format::kTurbo2I: return EncodeTurboRows(Turbo2ITable(), f, d, n, x, out);
    default: return EncodeTurboRows(Turbo2Table(), f, d, n, x, out);
  }
#else
  if (f == Format::kTurbo8) return EncodeTurbo8Groups(d, n, x, out);
  EncodeRowsScalar(f, d, n, x, out);
#endif
}

// For tests: the level the scale search takes (TurboSearchLevels).
void TurboSearchLevelsFor(Format f, size_t n, const float* a, const float* s, float* level) {
#if HWY_TARGET != HWY_SCALAR
  switch (f) {
    case Format::kTurbo4: return TurboSearchLevelsOf(Turbo4Table(), n, a, s, level);
    case Format::kTurbo4I: return TurboSearchLevelsOf(Turbo4ITable(), n, a, s, level);
    case Format::kTurbo3: return TurboSearchLevelsOf(Turbo3Table(), n, a, s, level);
    case Format::kTurbo3I: return TurboSearchLevelsOf(Turbo3ITable(), n, a, s, level);
    case Format::kTurbo2I: return TurboSearchLevelsOf(Turbo2ITable(), n, a, s, level);
    default: return TurboSearchLevelsOf(Turbo2Table(), n, a, s, level);
  }
#else
  // SCALAR encodes turbo with the reference: the level of NearestCode.
  for (size_t i = 0; i < n; ++i) {
    const float y = a[i] / s[i];
    const float* th = f == Format::kTurbo4    ? Turbo4Table().threshold
                      : f == Format::kTurbo4I ? Turbo4ITable().threshold
                      : f == Format::kTurbo3  ? Turbo3Table().threshold
                      : f == Format::kTurbo3I ? Turbo3ITable().threshold
                      : f == Format::kTurbo2I ? Turbo2ITable().threshold
                                              : Turbo2Table().threshold;
    const float* lv = f == Format::kTurbo4    ? Turbo4Table().level + 8
                      : f == Format::kTurbo4I ? Turbo4ITable().level + 8
                      : f == Format::kTurbo3  ? Turbo3Table().level + 4
                      : f == Format::kTurbo3I ? Turbo3ITable().level + 4
                      : f == Format::kTurbo2I ? Turbo2ITable().level + 2
                                              : Turbo2Table().level + 2;
    const bool l16 = f == Format::kTurbo4 || f == Format::kTurbo4I;
    const bool l8 = f == Format::kTurbo3 || f == Format::kTurbo3I;
    const size_t nt = l16 ? 7 : l8 ? 3 : 1;
    size_t c = 0;
    for (size_t j = 0; j < nt; ++j) c += y > th[j] ? 1 : 0;
    level[i] = lv[c];
  }
#endif
}
