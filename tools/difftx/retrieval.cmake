# `difftx retrieval`: the training demo. Its command (cmd_retrieval.cpp) is
# meant for the shared difftx tool; until that main is merged, difftx_retrieval
# is a stand-alone build of the one command (retrieval_main.cpp).
add_executable(difftx_retrieval difftx/retrieval_main.cpp difftx/cmd_retrieval.cpp)
target_include_directories(difftx_retrieval PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/difftx)
target_link_libraries(difftx_retrieval PRIVATE difftx::io CLI11::CLI11 Threads::Threads difftx_dev_flags)
