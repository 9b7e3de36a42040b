// Python ints into C++ integers as PyTorch takes them: an int or any object with __index__ (a NumPy integer),
// never a str or a float. nanobind's own integer caster, in its implicit-conversion pass, takes int(x) of
// anything that is not a float, so nn.Linear('4', 3) would have built a Linear of 4 inputs. These explicit
// specializations replace it for every integer type the package binds (included by binding.h, before any use).
#pragma once
#include <nanobind/nanobind.h>

#include <cstdint>
#include <limits>
#include <type_traits>

NAMESPACE_BEGIN(NB_NAMESPACE)
NAMESPACE_BEGIN(detail)

template <typename T>
struct index_only_int_caster {
    NB_INLINE bool from_python(handle src, uint8_t flags, cleanup_list*) noexcept {
        PyObject* o = src.ptr();
        if (PyLong_Check(o)) return load(o, flags);
        // The conversion pass: __index__ only (int(), which nanobind calls, parses strings).
        if (!(flags & (uint8_t)cast_flags::convert) || !PyIndex_Check(o)) return false;
        PyObject* index = PyNumber_Index(o);
        if (index == nullptr) {
            PyErr_Clear();
            return false;
        }
        const bool loaded = load(index, flags);
        Py_DECREF(index);
        return loaded;
    }

    NB_INLINE static handle from_cpp(T src, rv_policy, cleanup_list*) noexcept {
        if constexpr (std::is_signed_v<T>)
            return PyLong_FromLongLong(static_cast<long long>(src));
        else
            return PyLong_FromUnsignedLongLong(static_cast<unsigned long long>(src));
    }

    NB_TYPE_CASTER(T, const_name("int"))

private:
    // An int (a bool too: Python's bool is an int) into T, out-of-range values refused. Plain CPython calls, not
    // nanobind's load_i64 & co., whose signatures differ between nanobind releases (the pinned 2.4.0 here, a newer
    // one on the GPU machine).
    NB_INLINE bool load(PyObject* o, uint8_t) noexcept {
        if constexpr (std::is_signed_v<T>) {
            int overflow = 0;
            const long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
            if (v == -1 && PyErr_Occurred()) {
                PyErr_Clear();
                return false;
            }
            if (overflow != 0 || v < std::numeric_limits<T>::min() || v > std::numeric_limits<T>::max()) return false;
            value = static_cast<T>(v);
        } else {
            const unsigned long long v = PyLong_AsUnsignedLongLong(o);  // OverflowError for a negative int
            if (v == static_cast<unsigned long long>(-1) && PyErr_Occurred()) {
                PyErr_Clear();
                return false;
            }
            if (v > std::numeric_limits<T>::max()) return false;
            value = static_cast<T>(v);
        }
        return true;
    }
};

template <> struct type_caster<int> : index_only_int_caster<int> {};
template <> struct type_caster<unsigned int> : index_only_int_caster<unsigned int> {};
template <> struct type_caster<long> : index_only_int_caster<long> {};
template <> struct type_caster<unsigned long> : index_only_int_caster<unsigned long> {};
template <> struct type_caster<long long> : index_only_int_caster<long long> {};
template <> struct type_caster<unsigned long long> : index_only_int_caster<unsigned long long> {};

NAMESPACE_END(detail)
NAMESPACE_END(NB_NAMESPACE)
