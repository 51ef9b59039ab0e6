// The harness of the GPU attention tests, in the style of ggml's
// test-backend-ops: test_attention.cpp lists the cases (the kind and its
// options, the kernel families, the shape, how the inputs are drawn, the heads
// compared, the tolerance of each output) and check_cases runs each against the
// fp64 CPU reference (qattn::cpu) on the same bf16 inputs. A case draws its
// inputs from a generator of its own (the run's seed and the case's place in
// the list, so QATTN_TEST_SEED replays it whatever else runs), runs the forward
// and the backward twice on each family with every output poisoned with NaN
// first (an element the kernels forget to write fails the comparison), checks
// that the two backwards agree bit for bit, and compares O, the saved L where
// the case asks, dQ, dK and dV by relative L2 error.
//
// The special tests (test_attention_kinterval.cpp, test_attention_sage.cpp and
// the end of test_attention.cpp) check what a comparison with the reference
// cannot, with the same configs, inputs and runs.
#pragma once
#include <cuda_bf16.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "attention/attention.cuh"
#include "attention/fpa/fpa.cuh"
#include "attention/reference_check.hpp"
#include "attention/sage/sage.cuh"
#include "gpu_test_util.hpp"
#include "qattn/attention.hpp"

namespace qattn::test {

using cuda::AttentionErrors;
using cuda::AttentionShape;
using cuda::FpaKernels;

// ---------------------------------------------------------------------------
// Configs.

AttentionConfig kinterval_config(const KIntervalOptions& opt);
AttentionConfig sage_config(const SageOptions& opt = {});
// Sage (default options unless `sage` says otherwise) with a K-interval softmax block.
AttentionConfig composed_config(const KIntervalOptions& k, SageOptions sage = {});
// The 32 combinations of the K-interval options that change the maths, at K.
std::vector<KIntervalOptions> every_option_combination(int K);
// The kind, the options that change its maths and the shape, for messages.
std::string describe(const AttentionConfig& cfg, const AttentionShape& s);

// ---------------------------------------------------------------------------
// Kernel families. FpaKernels::automatic is what the attention API runs (wgmma
// where the device and the build have sm_90a); a case or test may name one.

// Whether this device and build run the wgmma kernels.
bool wgmma_available();
// The family's name in messages; automatic is named after what it runs here.
const char* family_name(FpaKernels family);
// Automatic, and mma.sync beside it where automatic is wgmma (Hopper).
std::vector<FpaKernels> every_family();

// The sage kernels that have a wgmma version and whether it runs the options
// (sage.cuh, SageTiles: cuda::sage_wgmma_forward_runs and the others).
bool wgmma_forward_runs(const SageOptions& opt);
bool wgmma_dq_runs(const SageOptions& opt);
bool wgmma_dkdv_runs(const SageOptions& opt);
bool some_sage_kernel_on_wgmma(const SageOptions& opt);
// mma.sync, and wgmma where some sage kernel runs these options on it; wgmma
// alone where any key is fp8.
std::vector<FpaKernels> sage_families(const SageOptions& opt);
// The default tiles with each kernel that has a wgmma version on `family`
// (wgmma only where it runs these options; the others on mma.sync).
cuda::SageTiles family_tiles(const SageOptions& opt, const AttentionShape& s, FpaKernels family);

// ---------------------------------------------------------------------------
// Inputs.

size_t qkv_size(const AttentionShape& s);   // (B, T, 3, H, d)
size_t head_size(const AttentionShape& s);  // (B, T, H, d)
// Element (b, t, slot, h, x) of a (B, T, nslots, H, d) tensor as float.
float element(const std::vector<bf16>& v, const AttentionShape& s, int nslots, int b, int t,
              int slot, int h, int x);
// One slot of a (B, T, 3, H, d) tensor as (B, T, H, d) floats.
std::vector<float> slot_of(const std::vector<bf16>& v, const AttentionShape& s, int slot);

// qkv (B, T, 3, H, d) with Q ~ N(0, q_sigma²), K ~ N(k_mean, k_sigma²) (k_mean:
// what smooth_k removes) and V ~ N(0, 1), rounded to bf16.
std::vector<bf16> normal_qkv(const AttentionShape& s, float q_sigma, float k_sigma, float k_mean,
                             std::mt19937_64& gen);
// (B, T, H, d) ~ N(0, 1) in bf16: dO, or an O.
std::vector<bf16> normal_heads(const AttentionShape& s, std::mt19937_64& gen);
struct AttentionInputs {
  std::vector<bf16> qkv, dout;
};

// The rows of 64-row block b times 2^-(b mod 13) (exact in bf16), so that the
// block scales span 2^12: of V (slot 2 of qkv, nslots 3) or of dO (nslots 1).
void scale_row_blocks(std::vector<bf16>& x, const AttentionShape& s, int nslots, int slot);

// Head bh = b·H + h of one slot all zeros: of V (slot 2 of qkv, nslots 3) or of
// dO (nslots 1).
void zero_head(std::vector<bf16>& x, const AttentionShape& s, int nslots, int slot, int bh);
// The head whose V or dO the zero_values and zero_dout recipes zero: the last
// one, b·H + h = B·H − 1.
int zeroed_head(const AttentionShape& s);

// Every later token's key repeats one of tokens 0-3 (which keep their own), so
// every row's max and min are shared by many keys.
void repeat_first_four_keys(std::vector<bf16>& qkv, const AttentionShape& s, std::mt19937_64& gen);

// Draws again, from N(0, q_sigma²), each query row of the heads b·H + h listed
// (all when empty) that has a score near a discontinuity of the K-interval
// softmax o (softmax_discontinuities.hpp). False when a row has not cleared the
// margin after 1000 draws: the inputs are degenerate.
bool keep_rows_off_discontinuities(const KIntervalOptions& o, const AttentionShape& s,
                                   std::vector<bf16>& qkv, const std::vector<int>& heads,
                                   float q_sigma, std::mt19937_64& gen);

// Q, K, V whose int8 quantisation is exact, on the GPU and in fp64 alike: every
// entry is n / 64 with n an integer (n ~ N(0, (64 sigma)²), |n| <= 126), and
// channel 0 is ±127 / 64 in every row, so each 64-row block's scale is exactly
// 1/64 and x / scale = n with no .5 to round either way. In every 64-row
// block the later half of the block's tokens of Q and K is the negation of the
// first half (grid_exact_pair), so the means that K-smoothing (over T) and
// Q-smoothing (per block) subtract are exactly 0, in fp32 as in fp64, and
// smooth_q's bias is 0: both sides quantise the same levels with any option.
// (The quantised softmax is discontinuous: one int8 level that the fp32
// pre-pass and the fp64 reference round differently moves a score across a
// grid boundary, which changes a weight by a factor e^Δ.) T must be even.
std::vector<bf16> grid_exact_qkv(const AttentionShape& s, float sigma, std::mt19937_64& gen);
// Draws again, grid-exact, each query row of grid_exact_qkv with a score near a
// discontinuity of the K-interval softmax o: the earlier token's q of its pair,
// and the negation with it, until neither row has one (false as above).
bool keep_grid_exact_rows_off_discontinuities(const KIntervalOptions& o, const AttentionShape& s,
                                              std::vector<bf16>& qkv, float sigma,
                                              std::mt19937_64& gen);

// ---------------------------------------------------------------------------
// GPU runs.

// Device buffers of one attention call: the inputs uploaded; the outputs, the
// saved statistics and buffer and the workspace poisoned with NaN, so that
// anything read before it is written shows.
struct AttentionBuffers {
  DeviceBuffer<bf16> qkv, o, dout,
      dqkv;                   // (B, T, 3, H, d), (B, T, H, d), (B, T, H, d), (B, T, 3, H, d)
  DeviceBuffer<float> stats;  // (B, H, T, row_stats)
  DeviceBuffer<unsigned char>
      saved;  // what the forward keeps for the backward (attention_saved_bytes)
  DeviceBuffer<unsigned char> work;  // the backward's scratch
  AttentionBuffers(const AttentionConfig& cfg, const AttentionShape& s,
                   const std::vector<bf16>& qkv_in, const std::vector<bf16>& dout_in);
};

// The forward and the backward on a family: automatic through the attention
// API (as training and the benchmark call it), a named family through the
// kind's own launchers (sage: family_tiles).
void forward_gpu(const AttentionConfig& cfg, const AttentionShape& s, AttentionBuffers& b,
                 FpaKernels family);
void backward_gpu(const AttentionConfig& cfg, const AttentionShape& s, AttentionBuffers& b,
                  FpaKernels family);

// Outputs of one forward + backward on the GPU.
struct GpuRun {
  std::vector<bf16> o, dqkv;  // (B, T, H, d), (B, T, 3, H, d)
  std::vector<float> stats;   // (B, H, T, row_stats): what the forward saved
};
// Forward, then backward twice, dQKV and the scratch poisoned before each (only
// the statistics and the saved buffer carry anything from the forward): the two
// gradients must agree bit for bit. Sage's second backward also gets Q and K of
// qkv poisoned (it reads Q̂, K̂ from the saved buffer, only V in place).
GpuRun run_gpu(const AttentionConfig& cfg, const AttentionShape& s, const std::vector<bf16>& qkv,
               const std::vector<bf16>& dout, FpaKernels family = FpaKernels::automatic);

// A run's O, dQ, dK, dV (and with `lse` the saved L, FPA's statistic) against
// the CPU reference of the same config, as relative L2 errors over the heads
// b·H + h listed (all when empty), the heads in parallel and summed in order.
AttentionErrors errors_against_cpu(const AttentionConfig& cfg, const AttentionShape& s,
                                   const std::vector<bf16>& qkv, const std::vector<bf16>& dout,
                                   const GpuRun& run, const std::vector<int>& heads = {},
                                   bool lse = false);

// ---------------------------------------------------------------------------
// The cases.

// Relative L2 bounds of each output; lse < 0: the saved statistic is not compared.
struct Tolerance {
  double o, lse, dq, dk, dv;
};
// CHECKs each error within its bound.
void check_errors(const AttentionErrors& e, const Tolerance& tol);

// How a case draws its inputs. dO ~ N(0, 1) but for zero_dout's head. With a K-interval softmax
// (the kind, or sage's block) the compared query rows are kept off its
// discontinuities (keep_rows_off_discontinuities, or the grid-exact redraw).
struct InputRecipe {
  enum Kind {
    normal,         // normal_qkv(q_sigma, k_sigma, k_mean)
    repeated_keys,  // normal, then repeat_first_four_keys
    grid_exact,     // grid_exact_qkv(q_sigma)
    wide_values,    // normal, then V's and dO's 64-row block b times 2^-(b mod 13)
    zero_values,    // normal, then V of head zeroed_head all zeros
    zero_dout,      // normal, then dO of head zeroed_head all zeros
  } kind = normal;
  float q_sigma = 1.0f, k_sigma = 1.0f, k_mean = 0.0f;
};

// The tolerances of the cases (relative L2 against the fp64 reference).

// FPA: bf16 operands (8-bit mantissa) with fp32 accumulation, so O, dQ, dK, dV
// land near 3e-3; L is fp32 throughout.
inline constexpr Tolerance kFpa{1e-2, 1e-4, 1e-2, 1e-2, 1e-2};

// K-interval: bf16 operands with fp32 accumulation as FPA; the inputs keep every
// compared score off the quantised softmax's discontinuities
// (softmax_discontinuities.hpp), where fp32 and fp64 scores could fall on two
// sides. Lerp's dQ and dK get 2.5e-2: its ŵ is continuous in the score but its
// derivative jumps by e^Δ at every grid point; the inputs keep scores off those
// too, but the rule still amplifies the bf16 rounding of its inputs: at K = 1
// minmax the calibration terms carry the bf16 O's rounding through ḡ = dO·O,
// summed over the row onto the argmax and argmin keys (1.0-1.6e-2 on an H200
// without the margin; tools/dev/kinterval_sensitivity.cpp measures the rule's
// amplification on the CPU in fp64). O and dV keep 1e-2.
inline constexpr Tolerance kKInterval{1e-2, -1, 1e-2, 1e-2, 1e-2};
inline constexpr Tolerance kKIntervalLerp{1e-2, -1, 2.5e-2, 2.5e-2, 1e-2};

// Plain sage on random inputs: bf16 outputs (~3e-3) plus int8 levels that flip
// where fp32 and fp64 straddle a .5 (three H200 runs: O <= 3.8e-3, dQ/dK/dV <=
// 5.8e-3).
inline constexpr Tolerance kSage{1e-2, -1, 2e-2, 2e-2, 2e-2};
// Sage with pv = fp8 at sigma = 5 (Q, K ~ N(0, 25)): rows nearly one-hot, so an
// int8 level of Q̂ or K̂ that flips between fp32 and fp64 moves a row's weights
// further than at sigma = 1; the e4m3 P̂ itself flips only where fp32 and fp64
// straddle a rounding boundary of e4m3 (relative 2^-4 apart).
inline constexpr Tolerance kSageSigma5{2e-2, -1, 5e-2, 5e-2, 5e-2};

// Sage with the K-interval block on grid-exact inputs: Q, K, V quantise to the
// same levels on both sides, so what is left is bf16 outputs and the P̃ / dS
// levels (<= 2.2e-3 in two H200 runs): 1e-2 for all four, tighter than plain
// sage's 2e-2 for the gradients, whose pre-pass levels flip. The scores are
// integers times one scale, so a grid coordinate can land exactly on a rounding
// boundary, where fp32 and fp64 may round apart: the query rows near a
// discontinuity are drawn again, and the means vanish per block
// (grid_exact_qkv), so that smooth_q's Q − μ_Q stays on the grid too.
inline constexpr Tolerance kSageKInterval{1e-2, -1, 1e-2, 1e-2, 1e-2};

struct AttentionCase {
  AttentionConfig cfg;               // the kind and its options
  std::vector<FpaKernels> families;  // each runs the case on the same inputs
  AttentionShape shape;
  InputRecipe inputs;
  std::vector<int> heads;  // b·H + h compared with the CPU reference; empty: every head
  Tolerance tol;
  uint64_t index = 0;  // place in the list: with the run's seed, the inputs' generator (item_rng)
};

// One family's run of a case (cases[c]).
struct CaseRun {
  size_t c;
  FpaKernels family;
  GpuRun run;
};
// Runs every case on each of its families the device has (wgmma needs sm_90a;
// mma.sync is dropped where automatic already is mma.sync), then checks each
// run against the CPU reference within the case's tolerance. Returns the runs,
// in the order of the cases and their families, for checks of their own.
std::vector<CaseRun> check_cases(const std::vector<AttentionCase>& cases);

}  // namespace qattn::test
