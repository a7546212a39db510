# Included into Horovod's CMake project via -DCMAKE_PROJECT_INCLUDE (see cmake-wrapper.sh).
# Horovod 0.28.1 asks for C++14, but PyTorch >= 2.1 headers need C++17 and PyTorch 2.14
# uses C++20 features (std::strong_ordering). Remapping what "C++14" compiles to keeps
# Horovod's sources untouched. Horovod master fixed this (PR #3998) after its last release.
set(CMAKE_CXX14_STANDARD_COMPILE_OPTION "-std=c++20")
set(CMAKE_CXX14_EXTENSION_COMPILE_OPTION "-std=gnu++20")
