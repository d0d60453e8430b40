// One registration function per file of python/src/, called by module.cpp.
#pragma once

#include <nanobind/nanobind.h>

namespace msa::py {

namespace nb = nanobind;

void bind_types(nanobind::module_& m);     // types.cpp: dtypes, layouts, model config, errors
void bind_caches(nanobind::module_& m);    // caches.cpp: cache geometry, views described
void bind_metadata(nanobind::module_& m);  // metadata.cpp: BatchMetadata from engine inputs
void bind_insert(nanobind::module_& m);    // insert.cpp: insert_kv, insert_index
void bind_index(nanobind::module_& m);     // index.cpp: index (block scores + top-k)
void bind_attend(nanobind::module_& m);    // attend.cpp: attend (output + lse)
void bind_plan(nanobind::module_& m);      // plan.cpp: attention shape, workspace, plan
void bind_testing(nanobind::module_& m);   // testing.cpp: the C++ engine's reference step

}  // namespace msa::py
