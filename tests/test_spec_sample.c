/* The speculative-sampling rule (sampler_spec_step, src/sample/sampler.c) on synthetic p and q:
 * a draft d ~ q, accepted with probability min(1, p(d)/q(d)), else replaced by a draw from
 * norm(max(0, p - q)), must give tokens distributed exactly as p.
 *
 * Statistical checks with fixed seeds (deterministic): for several (p, q) pairs, N = 200,000
 * draws; Pearson's chi-squared of the returned tokens against p, with its p-value from the
 * regularized upper incomplete gamma function; pass when the p-value is above 0.001 (a correct
 * rule fails one pair in a thousand seeds; the seeds are fixed, so the outcome is too). The
 * acceptance rate must match sum_i min(p_i, q_i) within 5 standard errors. A negative control
 * (the draft always accepted, i.e. sampling from q) must be rejected by the same test: the test
 * can fail. sampler_probs: sums to 1 and is one-hot for greedy. */
#include <math.h>

#include "sample/sampler.h"
#include "test.h"

/* Q(a, x) = Gamma(a, x) / Gamma(a): series for x < a + 1, continued fraction otherwise. */
static double gamma_q(double a, double x) {
  if (x <= 0) return 1.0;
  const double gln = lgamma(a);
  if (x < a + 1) {
    double ap = a, sum = 1.0 / a, del = sum;
    for (int n = 0; n < 1000; n++) {
      ap += 1;
      del *= x / ap;
      sum += del;
      if (fabs(del) < fabs(sum) * 1e-15) break;
    }
    return 1.0 - sum * exp(-x + a * log(x) - gln);
  }
  double b = x + 1 - a, c = 1.0 / 1e-300, d = 1.0 / b, h = d;
  for (int i = 1; i < 1000; i++) {
    const double an = -i * (i - a);
    b += 2;
    d = an * d + b;
    if (fabs(d) < 1e-300) d = 1e-300;
    c = b + an / c;
    if (fabs(c) < 1e-300) c = 1e-300;
    d = 1.0 / d;
    const double del = d * c;
    h *= del;
    if (fabs(del - 1) < 1e-15) break;
  }
  return exp(-x + a * log(x) - gln) * h;
}

/* chi-squared p-value of counts[n] (total N) against probabilities p[n] (cells with p = 0 must be empty) */
static double chi2_pvalue(const int64_t *cnt, const float *p, int n, int64_t N, bool *impossible) {
  double chi = 0;
  int df = -1;
  *impossible = false;
  for (int i = 0; i < n; i++) {
    if (p[i] <= 0) {
      *impossible |= cnt[i] > 0;
      continue;
    }
    const double e = (double)N * p[i];
    chi += ((double)cnt[i] - e) * ((double)cnt[i] - e) / e;
    df++;
  }
  return gamma_q(df / 2.0, chi / 2.0);
}

static void normalise(float *v, int n) {
  double s = 0;
  for (int i = 0; i < n; i++) s += v[i];
  for (int i = 0; i < n; i++) v[i] = (float)(v[i] / s);
}

int main(void) {
  char err[256];
  enum { N = 200000, NV = 9 };
  /* pairs: overlapping, q concentrated where p is not, q with support p lacks, p with support q lacks */
  static const float P[4][NV] = { { 5, 1, 3, 2, 8, 1, 1, 4, 2 }, { 1, 1, 1, 1, 1, 1, 1, 1, 1 },
                                  { 0, 3, 0, 6, 1, 0, 2, 0, 9 }, { 9, 0, 0, 0, 0, 0, 0, 1, 0 } };
  static const float Q[4][NV] = { { 4, 2, 3, 1, 9, 1, 2, 3, 2 }, { 20, 1, 0.5f, 1, 1, 1, 1, 1, 6 },
                                  { 1, 3, 1, 4, 1, 1, 2, 1, 7 }, { 0, 5, 5, 5, 0, 0, 0, 1, 0 } };
  sampler_params sp = sampler_default_params();
  sp.temperature = 1.0f;
  for (int c = 0; c < 4; c++) {
    SECTION("pair %d: %d draws", c, N);
    float p[NV], q[NV], tmp[NV];
    memcpy(p, P[c], sizeof p);
    memcpy(q, Q[c], sizeof q);
    normalise(p, NV);
    normalise(q, NV);
    sp.seed = 1000 + (uint64_t)c;
    sampler *s;
    if (sampler_new(&sp, NV, &s, err, sizeof err)) return 1;
    int64_t cnt[NV] = { 0 }, bad[NV] = { 0 }, acc = 0;
    for (int i = 0; i < N; i++) {
      const int32_t d = sampler_draw(s, q, NV);
      bool ok;
      const int32_t t = sampler_spec_step(s, p, q, NV, d, tmp, &ok);
      cnt[t]++;
      acc += ok;
      bad[d]++; /* negative control: always accept the draft (= sampling from q) */
    }
    bool imp, imp2;
    const double pv = chi2_pvalue(cnt, p, NV, N, &imp), pv_bad = chi2_pvalue(bad, p, NV, N, &imp2);
    double a_exp = 0;
    for (int i = 0; i < NV; i++) a_exp += fmin(p[i], q[i]);
    const double a_got = (double)acc / N, se = sqrt(a_exp * (1 - a_exp) / N) + 1e-12;
    printf("   chi-squared p-value %.4f (control: %.3g%s), acceptance %.4f (expected %.4f)\n", pv, pv_bad,
           imp2 ? ", impossible tokens" : "", a_got, a_exp);
    CHECK(!imp && pv > 1e-3, "tokens follow p: p-value %.4f > 0.001", pv);
    CHECK(imp2 || pv_bad < 1e-6, "the control (accept every draft) is rejected: p-value %.3g", pv_bad);
    CHECK(fabs(a_got - a_exp) <= 5 * se, "acceptance %.4f = sum min(p, q) %.4f within 5 se", a_got, a_exp);
    sampler_free(s);
  }
  SECTION("sampler_probs");
  float lg[NV] = { 1, 3, -2, 0.5f, 3, 2, -1, 0, 1 }, pr[NV];
  sp.seed = 7;
  sp.top_k = 4;
  sampler *s;
  if (sampler_new(&sp, NV, &s, err, sizeof err)) return 1;
  sampler_probs(s, lg, pr);
  double sum = 0;
  int nz = 0;
  for (int i = 0; i < NV; i++) sum += pr[i], nz += pr[i] > 0;
  CHECK(fabs(sum - 1) < 1e-6 && nz == 4, "top-k 4: sums to 1 (%.7f) over 4 tokens (%d)", sum, nz);
  CHECK(pr[1] == pr[4] && pr[1] > pr[5] && pr[5] > pr[0], "ordered like the logits");
  sampler_free(s);
  sp.temperature = 0;
  if (sampler_new(&sp, NV, &s, err, sizeof err)) return 1;
  sampler_probs(s, lg, pr);
  CHECK(pr[1] == 1.0f && pr[4] == 0.0f, "greedy: one-hot at the first maximum");
  sampler_free(s);
  return TEST_DONE();
}
