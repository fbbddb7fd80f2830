// z = x * sigmoid(x) * y, elementwise, float32: MindSpore's AOT kernel signature (ops.Custom, func_type="aot").
#include <cmath>
#include <cstdint>
#include <cstring>

extern "C" int SiluMul(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes, void *stream,
                       void *extra) {
  if (nparam != 3) return 1;
  for (int i = 0; i < 3; i++) {
    if (std::strcmp(dtypes[i], "float32") != 0) return 2;
  }
  const float *x = static_cast<const float *>(params[0]);
  const float *y = static_cast<const float *>(params[1]);
  float *z = static_cast<float *>(params[2]);
  int64_t n = 1;
  for (int d = 0; d < ndims[2]; d++) n *= shapes[2][d];
  for (int64_t i = 0; i < n; i++) z[i] = x[i] / (1.0f + std::exp(-x[i])) * y[i];
  return 0;
}
