// msa._msa: the nanobind extension behind the msa Python package.
#include <nanobind/nanobind.h>

#include "bindings.hpp"
#include "msa/error.hpp"

NB_MODULE(_msa, m) {
  m.doc() = "MiniMax-M3 block-sparse attention (msa): the C++ library's operations over DLPack arrays";
  // msa::Error becomes msa.Error (a RuntimeError) with the library's message.
  nanobind::exception<msa::Error>(m, "Error", PyExc_RuntimeError);
  msa::py::bind_types(m);
  msa::py::bind_caches(m);
  msa::py::bind_metadata(m);
  msa::py::bind_insert(m);
  msa::py::bind_index(m);
  msa::py::bind_attend(m);
#if MSA_HAVE_CUDA
  msa::py::bind_plan(m);
#endif
  nanobind::module_ testing = m.def_submodule("testing", "The C++ engine's reference step, for the tests.");
  msa::py::bind_testing(testing);
}
