#include "h5.hpp"

#include <stdexcept>
#include <sys/stat.h>

namespace ntp::h5 {

namespace {
hid_t checked(hid_t id, const std::string& what) {
  if (id < 0) throw std::runtime_error("HDF5: " + what);
  return id;
}
void checked(herr_t rc, const std::string& what, int) {
  if (rc < 0) throw std::runtime_error("HDF5: " + what);
}
}  // namespace

Handle::Handle(hid_t id, Closer closer, const std::string& what) : id_(checked(id, what)), closer_(closer) {}

Handle& Handle::operator=(Handle&& o) noexcept {
  if (this != &o) {
    reset();
    id_ = o.id_;
    closer_ = o.closer_;
    o.id_ = H5I_INVALID_HID;
  }
  return *this;
}

void Handle::reset() {
  if (id_ >= 0 && closer_) closer_(id_);
  id_ = H5I_INVALID_HID;
}

void silence_errors() { H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr); }

File::File(const std::string& path, Mode mode) : path_(path) {
  silence_errors();
  // A writer takes no HDF5 file lock. With it, the writer's exclusive lock refuses every reader
  // (h5py, `python -m analysis`) until the run ends; without it, readers' shared locks succeed
  // and they can read a running job's file (results/README.md, "Reading a run while it runs").
  // Readers keep HDF5's default locking.
  Handle fapl(H5Pcreate(H5P_FILE_ACCESS), H5Pclose, "file access properties");
  if (mode != Mode::ReadOnly)
    checked(H5Pset_file_locking(fapl, false, true), "disable file locking for " + path, 0);
  hid_t id = H5I_INVALID_HID;
  switch (mode) {
    case Mode::ReadOnly: id = H5Fopen(path.c_str(), H5F_ACC_RDONLY, fapl); break;
    case Mode::ReadWrite: id = H5Fopen(path.c_str(), H5F_ACC_RDWR, fapl); break;
    case Mode::Create: id = H5Fcreate(path.c_str(), H5F_ACC_EXCL, H5P_DEFAULT, fapl); break;
    case Mode::Truncate: id = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl); break;
  }
  if (id < 0) {
    struct stat st;
    const bool there = stat(path.c_str(), &st) == 0;
    if (mode == Mode::Create && there) throw std::runtime_error("HDF5: '" + path + "' already exists");
    if ((mode == Mode::ReadOnly || mode == Mode::ReadWrite) && !there)
      throw std::runtime_error("HDF5: '" + path + "' does not exist");
    throw std::runtime_error("HDF5: cannot open '" + path + "' (not an HDF5 file, or not writable)");
  }
  h_ = Handle(id, H5Fclose, "open " + path);
}

void File::flush() { checked(H5Fflush(h_.id(), H5F_SCOPE_GLOBAL), "flush " + path_, 0); }

bool exists(hid_t loc, const std::string& path) {
  // H5Lexists needs each parent to exist: walk the path.
  std::string partial;
  std::size_t start = path[0] == '/' ? 1 : 0;
  while (start <= path.size()) {
    const std::size_t slash = path.find('/', start);
    partial = path.substr(0, slash == std::string::npos ? path.size() : slash);
    if (partial.empty() || partial == "/") break;
    if (H5Lexists(loc, partial.c_str(), H5P_DEFAULT) <= 0) return false;
    if (slash == std::string::npos) break;
    start = slash + 1;
  }
  return true;
}

void ensure_groups(hid_t loc, const std::string& path) {
  std::size_t start = path[0] == '/' ? 1 : 0;
  while (start < path.size()) {
    const std::size_t slash = path.find('/', start);
    const std::string partial = path.substr(0, slash == std::string::npos ? path.size() : slash);
    if (H5Lexists(loc, partial.c_str(), H5P_DEFAULT) <= 0)
      Handle(H5Gcreate2(loc, partial.c_str(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Gclose,
             "create group " + partial);
    if (slash == std::string::npos) break;
    start = slash + 1;
  }
}

void write_floats(hid_t loc, const std::string& name, const std::vector<long>& shape, const float* data) {
  std::vector<hsize_t> dims(shape.begin(), shape.end());
  const auto slash = name.rfind('/');
  if (slash != std::string::npos && slash > 0) ensure_groups(loc, name.substr(0, slash));
  Handle space(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr), H5Sclose, "dataspace");
  Handle ds(H5Dcreate2(loc, name.c_str(), H5T_IEEE_F32LE, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Dclose,
            "create dataset " + name);
  checked(H5Dwrite(ds, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, data), "write " + name, 0);
}

std::vector<long> shape_of(hid_t loc, const std::string& name) {
  if (!exists(loc, name)) throw std::runtime_error("HDF5: dataset '" + name + "' is missing");
  Handle ds(H5Dopen2(loc, name.c_str(), H5P_DEFAULT), H5Dclose, "open dataset " + name);
  Handle space(H5Dget_space(ds), H5Sclose, "dataspace of " + name);
  const int rank = H5Sget_simple_extent_ndims(space);
  if (rank < 0) throw std::runtime_error("HDF5: dataspace of " + name + " is unreadable");
  std::vector<hsize_t> dims(rank);
  H5Sget_simple_extent_dims(space, dims.data(), nullptr);
  return std::vector<long>(dims.begin(), dims.end());
}

namespace {
// Only IEEE floats are read as floats. HDF5 would convert any numeric type (an integer tensor would
// load without a word), and a damaged type description can make its conversion ask for gigabytes
// (a 38 KB checkpoint asked for 4 GiB: fuzz/regressions/checkpoint).
void check_float_type(hid_t ds, const std::string& name) {
  Handle type(H5Dget_type(ds), H5Tclose, "type of " + name);
  for (hid_t ok : {H5T_IEEE_F32LE, H5T_IEEE_F32BE, H5T_IEEE_F64LE, H5T_IEEE_F64BE})
    if (H5Tequal(type, ok) > 0) return;
  throw std::runtime_error("HDF5: dataset '" + name + "' does not hold 32- or 64-bit IEEE floating-point numbers");
}
}  // namespace

std::vector<float> read_floats(hid_t loc, const std::string& name, const std::vector<long>& expect) {
  const auto shape = shape_of(loc, name);
  if (!expect.empty() && shape != expect) {
    auto str = [](const std::vector<long>& s) {
      std::string o = "[";
      for (std::size_t i = 0; i < s.size(); ++i) o += (i ? ", " : "") + std::to_string(s[i]);
      return o + "]";
    };
    throw std::runtime_error("HDF5: dataset '" + name + "' has shape " + str(shape) + ", expected " + str(expect));
  }
  long n = 1;
  for (long s : shape) n *= s;
  std::vector<float> out(n);
  Handle ds(H5Dopen2(loc, name.c_str(), H5P_DEFAULT), H5Dclose, "open dataset " + name);
  check_float_type(ds, name);
  checked(H5Dread(ds, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, out.data()), "read " + name, 0);
  return out;
}

namespace {
Handle open_for_attr(hid_t loc, const std::string& obj) {
  return Handle(H5Oopen(loc, obj.c_str(), H5P_DEFAULT), H5Oclose, "open object " + obj);
}
void write_attr(hid_t loc, const std::string& obj, const std::string& name, hid_t file_type, hid_t mem_type,
                const void* value) {
  Handle o = open_for_attr(loc, obj);
  if (H5Aexists(o, name.c_str()) > 0) H5Adelete(o, name.c_str());
  Handle space(H5Screate(H5S_SCALAR), H5Sclose, "scalar space");
  Handle a(H5Acreate2(o, name.c_str(), file_type, space, H5P_DEFAULT, H5P_DEFAULT), H5Aclose,
           "create attribute " + name);
  checked(H5Awrite(a, mem_type, value), "write attribute " + name, 0);
}
// Every attribute ntpbench reads holds one value, read into a buffer of one value: H5Aread writes
// as many values as the file's dataspace says, so an attribute of a damaged or foreign file that
// holds several would write past that buffer (fuzz_checkpoint found it: a stack overflow).
Handle open_attr(hid_t loc, const std::string& obj, const std::string& name) {
  Handle o = open_for_attr(loc, obj);
  if (H5Aexists(o, name.c_str()) <= 0)
    throw std::runtime_error("HDF5: attribute '" + name + "' missing on " + obj);
  Handle a(H5Aopen(o, name.c_str(), H5P_DEFAULT), H5Aclose, "open attribute " + name);
  Handle space(H5Aget_space(a), H5Sclose, "dataspace of attribute " + name);
  const hssize_t values = H5Sget_simple_extent_npoints(space);
  if (values != 1)
    throw std::runtime_error("HDF5: attribute '" + name + "' on " + obj + " holds " + std::to_string(values) +
                             " values, expected one");
  return a;
}
}  // namespace

void set_attr(hid_t loc, const std::string& obj, const std::string& name, const std::string& value) {
  // Variable-length UTF-8: h5py reads it as str.
  Handle type(H5Tcopy(H5T_C_S1), H5Tclose, "string type");
  H5Tset_size(type, H5T_VARIABLE);
  H5Tset_cset(type, H5T_CSET_UTF8);
  const char* p = value.c_str();
  write_attr(loc, obj, name, type, type, &p);
}
void set_attr(hid_t loc, const std::string& obj, const std::string& name, long long value) {
  write_attr(loc, obj, name, H5T_STD_I64LE, H5T_NATIVE_LLONG, &value);
}
void set_attr(hid_t loc, const std::string& obj, const std::string& name, double value) {
  write_attr(loc, obj, name, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, &value);
}

bool has_attr(hid_t loc, const std::string& obj, const std::string& name) {
  Handle o = open_for_attr(loc, obj);
  return H5Aexists(o, name.c_str()) > 0;
}

std::string get_attr_string(hid_t loc, const std::string& obj, const std::string& name) {
  Handle a = open_attr(loc, obj, name);
  Handle type(H5Aget_type(a), H5Tclose, "attribute type");
  if (H5Tis_variable_str(type) > 0) {
    char* s = nullptr;
    // Read with the file's own type: HDF5 does not convert between ASCII and UTF-8 strings.
    checked(H5Aread(a, type, &s), "read attribute " + name, 0);
    std::string out = s ? s : "";
    H5free_memory(s);
    return out;
  }
  const std::size_t n = H5Tget_size(type);
  std::string out(n, '\0');
  checked(H5Aread(a, type, out.data()), "read attribute " + name, 0);
  while (!out.empty() && out.back() == '\0') out.pop_back();
  return out;
}

long long get_attr_int(hid_t loc, const std::string& obj, const std::string& name) {
  Handle a = open_attr(loc, obj, name);
  long long v = 0;
  checked(H5Aread(a, H5T_NATIVE_LLONG, &v), "read attribute " + name, 0);
  return v;
}

double get_attr_double(hid_t loc, const std::string& obj, const std::string& name) {
  Handle a = open_attr(loc, obj, name);
  double v = 0;
  checked(H5Aread(a, H5T_NATIVE_DOUBLE, &v), "read attribute " + name, 0);
  return v;
}

}  // namespace ntp::h5
