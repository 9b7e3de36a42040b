// IDX files, the format of MNIST and Fashion-MNIST: a big-endian header, then the elements row-major.
//   magic   4 bytes  0x00 0x00 TT RR   (TT: element type, 0x08 = unsigned byte; RR: rank)
//   dims    RR × 4 bytes, big-endian unsigned
//   data    prod(dims) elements
// dyngrad reads unsigned-byte files (images 0x00000803, labels 0x00000801), plain or gzip-compressed:
// zlib's gzread passes uncompressed files through unchanged, so one code path reads both.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace dyngrad {

struct IdxArray {
    std::vector<std::int64_t> dims;
    std::vector<std::uint8_t> data;  // prod(dims) bytes, row-major
};

// Reads an unsigned-byte IDX file of rank `rank`. Throws IoError naming `path` and the problem: missing
// or unreadable file, corrupt gzip stream, wrong magic (not IDX, element type other than unsigned byte,
// rank other than `rank`), a zero or oversized dimension, a payload shorter than the dims announce, or
// bytes after it. ValueError, before the file is opened, for a rank outside 1..255.
IdxArray read_idx(const std::string& path, int rank);

}  // namespace dyngrad
