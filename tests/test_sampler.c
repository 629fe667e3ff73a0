/* Samplers: greedy, top-k/top-p/min-p truncation, temperature, seed reproducibility, bad params. */
#include <math.h>

#include "sample/sampler.h"
#include "test.h"

static int draw_counts(sampler_params p, const float *logits, int n, int draws, int *counts) {
  sampler *s;
  char err[256];
  if (sampler_new(&p, n, &s, err, sizeof err)) return -1;
  memset(counts, 0, sizeof(int) * (size_t)n);
  for (int i = 0; i < draws; i++) counts[sampler_sample(s, logits)]++;
  sampler_free(s);
  return 0;
}

int main(void) {
  enum { N = 1000 };
  static float logits[N];
  static int counts[N];
  floe_rng r;
  floe_rng_seed(&r, 7);
  for (int i = 0; i < N; i++) logits[i] = floe_rng_normal(&r);
  logits[123] = 5.0f;
  logits[456] = 4.5f;
  logits[789] = 4.0f;

  SECTION("greedy");
  sampler_params p = sampler_default_params();
  CHECK(sampler_argmax(logits, N) == 123, "argmax is 123");
  draw_counts(p, logits, N, 10, counts);
  CHECK(counts[123] == 10, "greedy always picks the max");
  float tie[4] = {1, 3, 3, 2};
  CHECK(sampler_argmax(tie, 4) == 1, "ties go to the lowest id");
  float withnan[3] = {NAN, 1, 0};
  CHECK(sampler_argmax(withnan, 3) == 1, "NaN never wins");

  SECTION("top-k = 1 is greedy; top-k = 3 only draws the three best");
  p.temperature = 1.0f;
  p.top_k = 1;
  draw_counts(p, logits, N, 200, counts);
  CHECK(counts[123] == 200, "top-k 1");
  p.top_k = 3;
  draw_counts(p, logits, N, 3000, counts);
  CHECK(counts[123] + counts[456] + counts[789] == 3000, "only top-3 drawn");
  /* expected shares e^5 : e^4.5 : e^4 = 0.506 : 0.307 : 0.186 */
  CHECK(fabs(counts[123] / 3000.0 - 0.506) < 0.04, "share of best %.3f ~ 0.506", counts[123] / 3000.0);
  CHECK(fabs(counts[789] / 3000.0 - 0.186) < 0.03, "share of third %.3f ~ 0.186", counts[789] / 3000.0);

  SECTION("top-p and min-p");
  p.top_k = 0;
  p.top_p = 0.01f;
  draw_counts(p, logits, N, 100, counts);
  CHECK(counts[123] == 100, "tiny top-p keeps only the best");
  p.top_p = 1.0f;
  p.min_p = 0.5f; /* keeps tokens with p >= 0.5 p_max: 123 (1), 456 (0.61); 789 is 0.37 */
  draw_counts(p, logits, N, 2000, counts);
  CHECK(counts[123] + counts[456] == 2000 && counts[456] > 0, "min-p 0.5 keeps two tokens");

  SECTION("temperature: low T concentrates, high T spreads");
  p.min_p = 0;
  p.temperature = 0.05f;
  draw_counts(p, logits, N, 500, counts);
  CHECK(counts[123] == 500, "T=0.05 is effectively greedy");
  p.temperature = 100.0f;
  draw_counts(p, logits, N, 5000, counts);
  int distinct = 0;
  for (int i = 0; i < N; i++) distinct += counts[i] > 0;
  CHECK(distinct > 900, "T=100 draws almost every token (%d distinct)", distinct);

  SECTION("seed reproducibility");
  p.temperature = 1.0f;
  p.top_p = 0.9f;
  p.seed = 42;
  sampler *a, *b, *c;
  char err[256];
  sampler_new(&p, N, &a, err, sizeof err);
  sampler_new(&p, N, &b, err, sizeof err);
  p.seed = 43;
  sampler_new(&p, N, &c, err, sizeof err);
  int same = 1, diff = 0;
  for (int i = 0; i < 200; i++) {
    int32_t x = sampler_sample(a, logits), y = sampler_sample(b, logits), z = sampler_sample(c, logits);
    same &= x == y;
    diff += x != z;
  }
  CHECK(same, "same seed, same tokens");
  CHECK(diff > 0, "different seed, different tokens (%d of 200 differ)", diff);
  sampler_free(a);
  sampler_free(b);
  sampler_free(c);

  SECTION("non-finite logits are never drawn (a +inf one once left min-p an unwritten candidate)");
  {
    float odd[6] = {-INFINITY, INFINITY, NAN, 2.0f, 1.0f, -INFINITY};
    int cnt[6];
    sampler_params q = sampler_default_params();
    q.temperature = 1.0f;
    q.min_p = 0.5f;
    CHECK(draw_counts(q, odd, 6, 300, cnt) == 0 && cnt[3] + cnt[4] == 300 && cnt[3] > cnt[4],
          "min-p with +inf and NaN present: only the finite 3 and 4 (%d, %d of 300)", cnt[3], cnt[4]);
    q.min_p = 0.0f;
    q.top_k = 1;
    CHECK(draw_counts(q, odd, 6, 50, cnt) == 0 && cnt[3] == 50, "top-k 1 with +inf present: the finite maximum");
    float none[3] = {INFINITY, NAN, -INFINITY};
    q.top_k = 0;
    CHECK(draw_counts(q, none, 3, 20, cnt) == 0 && cnt[0] == 20, "no finite logit: the argmax (+inf)");
  }

  SECTION("bad parameters");
  sampler *bad;
  p = sampler_default_params();
  p.top_p = 0;
  CHECK(sampler_new(&p, N, &bad, err, sizeof err) == FLOE_E_INVALID && strstr(err, "top_p"), "top_p 0: %s", err);
  p = sampler_default_params();
  p.temperature = NAN;
  CHECK(sampler_new(&p, N, &bad, err, sizeof err) == FLOE_E_INVALID && strstr(err, "temperature"), "temp NaN: %s", err);
  p = sampler_default_params();
  p.min_p = 2;
  CHECK(sampler_new(&p, N, &bad, err, sizeof err) == FLOE_E_INVALID && strstr(err, "min_p"), "min_p 2: %s", err);
  return TEST_DONE();
}
