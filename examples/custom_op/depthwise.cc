// 3x3 depthwise convolution with padding 1 and a bias, NCHW float32: MindSpore's AOT kernel signature
// (ops.Custom, func_type="aot"). Inputs x (N, C, H, W), w (C, 1, 3, 3), b (C); output (N, C, OH, OW).
// One function per stride: the stride is in the function, the sizes come from the shapes.
#include <cstdint>
#include <cstring>

namespace {

template <int S>
int depthwise3x3(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes) {
  if (nparam != 4 || ndims[0] != 4 || ndims[3] != 4) return 1;
  for (int i = 0; i < 4; i++) {
    if (std::strcmp(dtypes[i], "float32") != 0) return 2;
  }
  const float *x = static_cast<const float *>(params[0]);
  const float *w = static_cast<const float *>(params[1]);
  const float *b = static_cast<const float *>(params[2]);
  float *y = static_cast<float *>(params[3]);
  const int64_t n = shapes[0][0], c = shapes[0][1], h = shapes[0][2], wd = shapes[0][3];
  const int64_t oh = shapes[3][2], ow = shapes[3][3];
  for (int64_t plane = 0; plane < n * c; plane++) {
    const int64_t ch = plane % c;
    const float *in = x + plane * h * wd;
    const float *k = w + ch * 9;
    float *out = y + plane * oh * ow;
    for (int64_t i = 0; i < oh; i++) {
      const int64_t top = i * S - 1;
      for (int64_t j = 0; j < ow; j++) {
        const int64_t left = j * S - 1;
        float acc = b[ch];
        if (top >= 0 && top + 2 < h && left >= 0 && left + 2 < wd) {  // interior: no bounds checks
          const float *p = in + top * wd + left;
          acc += p[0] * k[0] + p[1] * k[1] + p[2] * k[2];
          acc += p[wd] * k[3] + p[wd + 1] * k[4] + p[wd + 2] * k[5];
          acc += p[2 * wd] * k[6] + p[2 * wd + 1] * k[7] + p[2 * wd + 2] * k[8];
        } else {
          for (int di = 0; di < 3; di++) {
            const int64_t r = top + di;
            if (r < 0 || r >= h) continue;
            for (int dj = 0; dj < 3; dj++) {
              const int64_t q = left + dj;
              if (q >= 0 && q < wd) acc += in[r * wd + q] * k[di * 3 + dj];
            }
          }
        }
        out[i * ow + j] = acc;
      }
    }
  }
  return 0;
}

}  // namespace

extern "C" int DepthwiseConv3x3S1(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                                  void *stream, void *extra) {
  return depthwise3x3<1>(nparam, params, ndims, shapes, dtypes);
}

extern "C" int DepthwiseConv3x3S2(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                                  void *stream, void *extra) {
  return depthwise3x3<2>(nparam, params, ndims, shapes, dtypes);
}
