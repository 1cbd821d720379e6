# difftx_policy_runners(OUT POLICY...): the units that instantiate the difftx
# tool's runners (tools/difftx/policy_runners.hpp), one per policy and number
# type, written into the build tree from tools/difftx/policy_runners.cpp.in;
# OUT gets their paths. Used by the tool (every host policy) and fuzz_run
# (the reference policy alone).
function(difftx_policy_runners out)
  set(type_names float64 float32 float16 bfloat16)
  set(types double float Eigen::half Eigen::bfloat16)
  set(units)
  foreach(DIFFTX_POLICY ${ARGN})
    foreach(i RANGE 3)
      list(GET type_names ${i} DIFFTX_TYPE_NAME)
      list(GET types ${i} DIFFTX_TYPE)
      set(unit ${CMAKE_CURRENT_BINARY_DIR}/policy_runners_${DIFFTX_POLICY}_${DIFFTX_TYPE_NAME}.cpp)
      configure_file(${PROJECT_SOURCE_DIR}/tools/difftx/policy_runners.cpp.in ${unit} @ONLY)
      list(APPEND units ${unit})
    endforeach()
  endforeach()
  set(${out} ${units} PARENT_SCOPE)
endfunction()
