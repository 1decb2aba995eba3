#!/bin/sh
# CMAKE_CXX_COMPILER_LAUNCHER for building Horovod 0.28.1 against torch >= 2.1.
#
# Why: torch's headers need C++17, but Horovod's CMakeLists adds `-std=c++14`. A flag in
# CXXFLAGS lands *before* CMake's own, so the last one (c++14) wins. CMake runs
# `<launcher> <compiler> <args...>` for every C++ compile, so we append `-std=c++17`
# after everything else, where it wins.
exec "$@" -std=c++17
