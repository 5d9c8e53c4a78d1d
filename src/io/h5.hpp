#pragma once
// A small RAII layer over the HDF5 C API: handles close themselves, errors throw with the path.
#include <hdf5.h>

#include <string>
#include <vector>

namespace ntp::h5 {

// An owned hid_t, closed with the matching H5*close.
class Handle {
 public:
  using Closer = herr_t (*)(hid_t);
  Handle() = default;
  Handle(hid_t id, Closer closer, const std::string& what);
  ~Handle() { reset(); }
  Handle(Handle&& o) noexcept : id_(o.id_), closer_(o.closer_) { o.id_ = H5I_INVALID_HID; }
  Handle& operator=(Handle&& o) noexcept;
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  hid_t id() const { return id_; }
  operator hid_t() const { return id_; }
  void reset();

 private:
  hid_t id_ = H5I_INVALID_HID;
  Closer closer_ = nullptr;
};

enum class Mode { ReadOnly, ReadWrite, Create /* fails if the file exists */, Truncate };

// Files opened for writing take no HDF5 file lock, so that readers can open them while they are
// written; read-only opens keep HDF5's default (a shared lock).
class File {
 public:
  File(const std::string& path, Mode mode);
  hid_t id() const { return h_.id(); }
  const std::string& path() const { return path_; }
  void flush();

 private:
  std::string path_;
  Handle h_;
};

bool exists(hid_t loc, const std::string& path);
// Creates every missing group along "a/b/c".
void ensure_groups(hid_t loc, const std::string& path);

// Whole-array float datasets with a given shape.
void write_floats(hid_t loc, const std::string& name, const std::vector<long>& shape, const float* data);
// Reads a float dataset; checks its shape when `expect` is not empty.
std::vector<float> read_floats(hid_t loc, const std::string& name, const std::vector<long>& expect = {});
std::vector<long> shape_of(hid_t loc, const std::string& name);

// Attributes on an object (the file root is "/").
void set_attr(hid_t loc, const std::string& obj, const std::string& name, const std::string& value);
void set_attr(hid_t loc, const std::string& obj, const std::string& name, long long value);
void set_attr(hid_t loc, const std::string& obj, const std::string& name, double value);
bool has_attr(hid_t loc, const std::string& obj, const std::string& name);
std::string get_attr_string(hid_t loc, const std::string& obj, const std::string& name);
long long get_attr_int(hid_t loc, const std::string& obj, const std::string& name);
double get_attr_double(hid_t loc, const std::string& obj, const std::string& name);

// Quiets HDF5's automatic error printing (we throw instead).
void silence_errors();

}  // namespace ntp::h5
