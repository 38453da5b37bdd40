// Texture objects for the CPU emulator (included by cuda_runtime.h): CUDA arrays (1D and 2D),
// linear and pitched-2D resources, and tex1Dfetch / tex1D / tex2D reads with the addressing
// modes (clamp, border, wrap, mirror), point and linear filtering, element-type and
// normalized-float reads, and normalized coordinates, as the CUDA programming guide's texture
// fetching appendix defines them. Not modelled (the translator refuses them): 3D, layered and
// cubemap textures, mipmaps, surfaces. Linear filtering here weighs texels with exact fractions;
// a GPU uses 9-bit fixed-point weights, so results can differ in the last bits (assumption:
// a compare.py with a float tolerance accepts both).
#pragma once
#include <algorithm>

enum cudaChannelFormatKind { cudaChannelFormatKindSigned = 0, cudaChannelFormatKindUnsigned = 1,
                             cudaChannelFormatKindFloat = 2, cudaChannelFormatKindNone = 3 };
struct cudaChannelFormatDesc { int x, y, z, w; cudaChannelFormatKind f; };
enum cudaResourceType { cudaResourceTypeArray = 0, cudaResourceTypeMipmappedArray = 1, cudaResourceTypeLinear = 2,
                        cudaResourceTypePitch2D = 3 };
enum cudaTextureAddressMode { cudaAddressModeWrap = 0, cudaAddressModeClamp = 1, cudaAddressModeMirror = 2,
                              cudaAddressModeBorder = 3 };
enum cudaTextureFilterMode { cudaFilterModePoint = 0, cudaFilterModeLinear = 1 };
enum cudaTextureReadMode { cudaReadModeElementType = 0, cudaReadModeNormalizedFloat = 1 };
enum { cudaArrayDefault = 0 };

struct cudaArray {
    cudaChannelFormatDesc desc;
    size_t width, height, elem;  // height 1 for a 1D array; elem: bytes per texel
    char* data;                  // device memory, rows of width * elem bytes
};
typedef cudaArray* cudaArray_t;
typedef const cudaArray* cudaArray_const_t;
struct cudaMipmappedArray;
typedef cudaMipmappedArray* cudaMipmappedArray_t;

struct cudaResourceDesc {
    cudaResourceType resType;
    union {
        struct { cudaArray_t array; } array;
        struct { cudaMipmappedArray_t mipmap; } mipmap;
        struct { void* devPtr; cudaChannelFormatDesc desc; size_t sizeInBytes; } linear;
        struct { void* devPtr; cudaChannelFormatDesc desc; size_t width, height, pitchInBytes; } pitch2D;
    } res;
};
struct cudaTextureDesc {
    cudaTextureAddressMode addressMode[3];
    cudaTextureFilterMode filterMode;
    cudaTextureReadMode readMode;
    int sRGB;
    float borderColor[4];
    int normalizedCoords;
    unsigned int maxAnisotropy;
    cudaTextureFilterMode mipmapFilterMode;
    float mipmapLevelBias, minMipmapLevelClamp, maxMipmapLevelClamp;
    int disableTrilinearOptimization, seamlessCubemap;
};
struct cudaResourceViewDesc;
typedef unsigned long long cudaTextureObject_t;

inline cudaChannelFormatDesc cudaCreateChannelDesc(int x, int y, int z, int w, cudaChannelFormatKind f) {
    return {x, y, z, w, f};
}
namespace cuset_emu {
template <class T> struct ChannelOf;  // scalar type of a texel type's channels, and their count
#define CUSET_CHANNELS(S, N, K) template <> struct ChannelOf<S> { static constexpr int n = 1; \
        static constexpr cudaChannelFormatKind kind = K; using scalar = S; }; \
    template <> struct ChannelOf<N##1> : ChannelOf<S> {}; \
    template <> struct ChannelOf<N##2> : ChannelOf<S> { static constexpr int n = 2; }; \
    template <> struct ChannelOf<N##4> : ChannelOf<S> { static constexpr int n = 4; };
CUSET_CHANNELS(signed char, char, cudaChannelFormatKindSigned)
CUSET_CHANNELS(unsigned char, uchar, cudaChannelFormatKindUnsigned)
CUSET_CHANNELS(short, short, cudaChannelFormatKindSigned)
CUSET_CHANNELS(unsigned short, ushort, cudaChannelFormatKindUnsigned)
CUSET_CHANNELS(int, int, cudaChannelFormatKindSigned)
CUSET_CHANNELS(unsigned int, uint, cudaChannelFormatKindUnsigned)
CUSET_CHANNELS(float, float, cudaChannelFormatKindFloat)
#undef CUSET_CHANNELS
template <> struct ChannelOf<char> : ChannelOf<signed char> {};
}  // namespace cuset_emu
template <class T> inline cudaChannelFormatDesc cudaCreateChannelDesc() {
    using C = cuset_emu::ChannelOf<T>;
    int bits = int(8 * sizeof(typename C::scalar));
    return {bits, C::n > 1 ? bits : 0, C::n > 2 ? bits : 0, C::n > 3 ? bits : 0, C::kind};
}

namespace cuset_emu {
inline int channels(const cudaChannelFormatDesc& d) { return (d.x > 0) + (d.y > 0) + (d.z > 0) + (d.w > 0); }
inline size_t texel_bytes(const cudaChannelFormatDesc& d) { return size_t(d.x + d.y + d.z + d.w) / 8; }

// One texture object: where its texels lie and how they are read.
struct Texture {
    const char* base;
    size_t width, height, pitch, elem;  // pitch: bytes from one row to the next
    cudaChannelFormatDesc desc;
    cudaTextureDesc how;
};
inline std::vector<Texture>& textures() { static std::vector<Texture> t; return t; }  // object id - 1

inline const Texture& texture(cudaTextureObject_t id) {
    if (id == 0 || id > textures().size()) fatal("texture read through an invalid texture object");
    return textures()[id - 1];
}

// Texel index of coordinate `c` (unnormalized, texel centres at i + 0.5) along an axis of `n`
// texels, or -1 for the border.
inline long address(float c, size_t n, cudaTextureAddressMode mode, bool normalized) {
    float u = normalized ? c * float(n) : c;
    if (normalized && mode == cudaAddressModeWrap) u = (c - std::floor(c)) * float(n);
    if (normalized && mode == cudaAddressModeMirror) {
        float f = c - 2.0f * std::floor(c / 2.0f);  // within [0, 2): the second half reads backwards
        u = (f < 1.0f ? f : 2.0f - f) * float(n);
    }
    long i = long(std::floor(u));
    if (i >= 0 && size_t(i) < n) return i;
    return mode == cudaAddressModeBorder ? -1 : (i < 0 ? 0 : long(n) - 1);
}

// Channel k of texel (i, j) as a float, converted as the read mode says (border: 0).
inline float channel(const Texture& t, long i, long j, int k) {
    if (i < 0 || j < 0) return t.how.borderColor[k];
    const char* p = t.base + size_t(j) * t.pitch + size_t(i) * t.elem + size_t(k) * (t.desc.x / 8);
    bool norm = t.how.readMode == cudaReadModeNormalizedFloat;
    if (t.desc.f == cudaChannelFormatKindFloat && t.desc.x != 32) fatal("texture: 16-bit float channels");
    switch (t.desc.f == cudaChannelFormatKindFloat ? 0 : t.desc.x) {
        case 0: { float v; std::memcpy(&v, p, 4); return v; }
        case 8: {
            if (t.desc.f == cudaChannelFormatKindSigned) {
                int8_t v = int8_t(*p); return norm ? std::max(v / 127.0f, -1.0f) : float(v);
            }
            uint8_t v = uint8_t(*p); return norm ? v / 255.0f : float(v);
        }
        case 16: {
            if (t.desc.f == cudaChannelFormatKindSigned) {
                int16_t v; std::memcpy(&v, p, 2); return norm ? std::max(v / 32767.0f, -1.0f) : float(v);
            }
            uint16_t v; std::memcpy(&v, p, 2); return norm ? v / 65535.0f : float(v);
        }
        default: fatal("texture: normalized-float or linear reads of 32-bit integer channels");
    }
}

// A texel read as raw bytes (point filtering, element-type reads: the GPU's result bit for bit; the
// border reads zeros).
template <class T> inline T fetch_raw(const Texture& t, long i, long j) {
    if (sizeof(T) != t.elem) fatal("texture read with a type whose size differs from the texel's");
    T v;
    if (i < 0 || j < 0) std::memset(&v, 0, sizeof v);
    else std::memcpy(&v, t.base + size_t(j) * t.pitch + size_t(i) * t.elem, sizeof v);
    return v;
}

// A float-typed read (linear filtering or normalized-float mode): channels blended, into T's floats.
template <class T> inline T fetch_float(const Texture& t, float x, float y, bool two_d) {
    static_assert(sizeof(T) % sizeof(float) == 0, "filtered texture reads return float types");
    float out[sizeof(T) / sizeof(float)] = {};
    bool norm = t.how.normalizedCoords != 0;
    bool linear = t.how.filterMode == cudaFilterModeLinear;
    // Linear filtering blends the texels around (x - 0.5, y - 0.5), unnormalized (programming guide).
    float ux = (norm ? x * float(t.width) : x) - (linear ? 0.5f : 0.0f);
    float uy = (norm ? y * float(t.height) : y) - (linear ? 0.5f : 0.0f);
    float fx = std::floor(ux), fy = std::floor(uy);
    float ax = linear ? ux - fx : 0.0f, ay = linear && two_d ? uy - fy : 0.0f;
    for (int dj = 0; dj < (ay > 0.0f ? 2 : 1); ++dj)
        for (int di = 0; di < (ax > 0.0f ? 2 : 1); ++di) {
            float w = (di ? ax : 1.0f - ax) * (dj ? ay : 1.0f - ay);
            // texel centre of this neighbour, back in the coordinates address() takes
            float cx = (fx + di + 0.5f) / (norm ? float(t.width) : 1.0f);
            float cy = (fy + dj + 0.5f) / (norm ? float(t.height) : 1.0f);
            long i = address(cx, t.width, t.how.addressMode[0], norm);
            long j = two_d ? address(cy, t.height, t.how.addressMode[1], norm) : 0;
            for (int k = 0; k < std::min(channels(t.desc), int(sizeof(T) / sizeof(float))); ++k)
                out[k] += w * channel(t, i, i < 0 ? -1 : j, k);
        }
    T v;
    std::memcpy(&v, out, sizeof v);
    return v;
}

template <class T> inline T read(cudaTextureObject_t id, float x, float y, bool two_d) {
    const Texture& t = texture(id);
    if (t.how.filterMode == cudaFilterModeLinear || t.how.readMode == cudaReadModeNormalizedFloat) {
        if constexpr (sizeof(T) % sizeof(float) == 0) return fetch_float<T>(t, x, y, two_d);
        fatal("texture: a filtered or normalized read must return a float type");
    }
    bool norm = t.how.normalizedCoords != 0;
    long i = address(x, t.width, t.how.addressMode[0], norm);
    long j = two_d ? address(y, t.height, t.how.addressMode[1], norm) : 0;
    return fetch_raw<T>(t, i, i < 0 ? -1 : j);
}
}  // namespace cuset_emu

inline cudaError_t cudaMallocArray(cudaArray_t* a, const cudaChannelFormatDesc* desc, size_t width,
                                   size_t height = 0, unsigned = 0) {
    if (a == nullptr || desc == nullptr || width == 0 || cuset_emu::texel_bytes(*desc) == 0)
        return cuset_emu::fail(cudaErrorInvalidValue);
    size_t rows = height ? height : 1, elem = cuset_emu::texel_bytes(*desc);
    void* data = nullptr;
    if (cudaError_t e = cuset_emu::device_alloc(&data, width * rows * elem)) return e;
    *a = new cudaArray{*desc, width, rows, elem, static_cast<char*>(data)};
    return cudaSuccess;
}
inline cudaError_t cudaFreeArray(cudaArray_t a) {
    if (a == nullptr) return cudaSuccess;
    cudaError_t e = cuset_emu::device_free(a->data);
    delete a;
    return e;
}
namespace cuset_emu {
// The memcpy kind of a copy whose array side is device memory (`into`: the array is the target).
inline cudaMemcpyKind array_kind(cudaMemcpyKind kind, bool into) {
    bool other_on_device = kind == (into ? cudaMemcpyDeviceToHost : cudaMemcpyHostToDevice)
                           || kind == cudaMemcpyDeviceToDevice;
    return other_on_device ? cudaMemcpyDeviceToDevice : (into ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost);
}
inline bool fits(cudaArray_const_t a, size_t w_offset, size_t h_offset, size_t width, size_t height) {
    return a != nullptr && w_offset + width <= a->width * a->elem && h_offset + height <= a->height;
}
inline char* at(cudaArray_const_t a, size_t w_offset, size_t h_offset) {  // wOffset in bytes
    return a->data + h_offset * a->width * a->elem + w_offset;
}
}  // namespace cuset_emu

// Copies between memory and a rectangle of an array (wOffset and width in bytes).
inline cudaError_t cudaMemcpy2DToArray(cudaArray_t dst, size_t w_offset, size_t h_offset, const void* src,
                                       size_t spitch, size_t width, size_t height, cudaMemcpyKind kind) {
    if (!cuset_emu::fits(dst, w_offset, h_offset, width, height)) return cuset_emu::fail(cudaErrorInvalidValue);
    return cudaMemcpy2D(cuset_emu::at(dst, w_offset, h_offset), dst->width * dst->elem, src, spitch, width, height,
                        cuset_emu::array_kind(kind, true));
}
inline cudaError_t cudaMemcpy2DFromArray(void* dst, size_t dpitch, cudaArray_const_t src, size_t w_offset,
                                         size_t h_offset, size_t width, size_t height, cudaMemcpyKind kind) {
    if (!cuset_emu::fits(src, w_offset, h_offset, width, height)) return cuset_emu::fail(cudaErrorInvalidValue);
    return cudaMemcpy2D(dst, dpitch, cuset_emu::at(src, w_offset, h_offset), src->width * src->elem, width, height,
                        cuset_emu::array_kind(kind, false));
}
// The deprecated linear forms: `count` bytes from (wOffset, hOffset) on, running across rows.
inline cudaError_t cudaMemcpyToArray(cudaArray_t dst, size_t w_offset, size_t h_offset, const void* src,
                                     size_t count, cudaMemcpyKind kind) {
    if (!cuset_emu::fits(dst, 0, h_offset, 0, 1)) return cuset_emu::fail(cudaErrorInvalidValue);
    return cuset_emu::copy(cuset_emu::at(dst, w_offset, h_offset), src, count, cuset_emu::array_kind(kind, true));
}
inline cudaError_t cudaMemcpyFromArray(void* dst, cudaArray_const_t src, size_t w_offset, size_t h_offset,
                                       size_t count, cudaMemcpyKind kind) {
    if (!cuset_emu::fits(src, 0, h_offset, 0, 1)) return cuset_emu::fail(cudaErrorInvalidValue);
    return cuset_emu::copy(dst, cuset_emu::at(src, w_offset, h_offset), count, cuset_emu::array_kind(kind, false));
}

inline cudaError_t cudaCreateTextureObject(cudaTextureObject_t* id, const cudaResourceDesc* res,
                                           const cudaTextureDesc* how, const cudaResourceViewDesc* = nullptr) {
    if (id == nullptr || res == nullptr || how == nullptr) return cuset_emu::fail(cudaErrorInvalidValue);
    cuset_emu::Texture t{};
    t.how = *how;
    switch (res->resType) {
        case cudaResourceTypeArray: {
            const cudaArray* a = res->res.array.array;
            if (a == nullptr) return cuset_emu::fail(cudaErrorInvalidValue);
            t = {a->data, a->width, a->height, a->width * a->elem, a->elem, a->desc, *how};
            break;
        }
        case cudaResourceTypeLinear: {
            const auto& l = res->res.linear;
            size_t elem = cuset_emu::texel_bytes(l.desc);
            if (elem == 0 || !cuset_emu::is_device(l.devPtr, l.sizeInBytes))
                return cuset_emu::fail(cudaErrorInvalidValue);
            t = {static_cast<const char*>(l.devPtr), l.sizeInBytes / elem, 1, l.sizeInBytes, elem, l.desc, *how};
            break;
        }
        case cudaResourceTypePitch2D: {
            const auto& p = res->res.pitch2D;
            size_t elem = cuset_emu::texel_bytes(p.desc);
            bool inside = cuset_emu::is_device(p.devPtr, p.pitchInBytes * p.height);
            if (elem == 0 || p.width * elem > p.pitchInBytes || !inside) return cuset_emu::fail(cudaErrorInvalidValue);
            t = {static_cast<const char*>(p.devPtr), p.width, p.height, p.pitchInBytes, elem, p.desc, *how};
            break;
        }
        default: cuset_emu::fatal("texture objects over mipmapped arrays");
    }
    cuset_emu::textures().push_back(t);
    *id = cuset_emu::textures().size();
    return cudaSuccess;
}
inline cudaError_t cudaDestroyTextureObject(cudaTextureObject_t id) {
    return id == 0 || id > cuset_emu::textures().size() ? cuset_emu::fail(cudaErrorInvalidValue) : cudaSuccess;
}

template <class T> inline T tex1Dfetch(cudaTextureObject_t id, int i) {
    const cuset_emu::Texture& t = cuset_emu::texture(id);
    long at = i >= 0 && size_t(i) < t.width ? i : -1;  // integer addressing: outside reads zero
    if (t.how.readMode == cudaReadModeNormalizedFloat) {
        if constexpr (sizeof(T) % sizeof(float) == 0) {
            float out[sizeof(T) / sizeof(float)] = {};
            for (int k = 0; k < std::min(cuset_emu::channels(t.desc), int(sizeof(T) / sizeof(float))); ++k)
                out[k] = at < 0 ? 0.0f : cuset_emu::channel(t, at, 0, k);
            T v;
            std::memcpy(&v, out, sizeof v);
            return v;
        }
    }
    return cuset_emu::fetch_raw<T>(t, at, 0);
}
template <class T> inline T tex1D(cudaTextureObject_t id, float x) {
    return cuset_emu::read<T>(id, x, 0.0f, false);
}
template <class T> inline T tex2D(cudaTextureObject_t id, float x, float y) {
    return cuset_emu::read<T>(id, x, y, true);
}
template <class T> inline void tex2D(T* out, cudaTextureObject_t id, float x, float y) { *out = tex2D<T>(id, x, y); }
template <class T> inline void tex1Dfetch(T* out, cudaTextureObject_t id, int i) { *out = tex1Dfetch<T>(id, i); }
