# Read by ggml's CMake right after its project() (CMAKE_PROJECT_ggml_INCLUDE, set by `make setup-cuda`).
# The CUDA toolkit here (/usr/local/cuda-13.0: nvcc and cudart) has no cuBLAS, which ggml-cuda links; the pinned
# nvidia-cublas wheel brings it into the venv, at AURAL_CUBLAS_ROOT (site-packages/nvidia/cu13).
if(NOT IS_DIRECTORY "${AURAL_CUBLAS_ROOT}/include")
    message(FATAL_ERROR "AURAL_CUBLAS_ROOT (${AURAL_CUBLAS_ROOT}) holds no cuBLAS headers: install nvidia-cublas")
endif()
# FindCUDAToolkit searches for libcublas.so, the link name a -dev package installs and a wheel does not: name
# the libraries by their run-time names instead (linking records their SONAME, libcublas.so.13, all the same).
set(CUDA_cublas_LIBRARY "${AURAL_CUBLAS_ROOT}/lib/libcublas.so.13" CACHE FILEPATH "cuBLAS of the nvidia-cublas wheel")
set(CUDA_cublasLt_LIBRARY "${AURAL_CUBLAS_ROOT}/lib/libcublasLt.so.13" CACHE FILEPATH "cuBLASLt of the nvidia-cublas wheel")
# The headers, for nvcc only: CMAKE_CUDA_FLAGS starts from this when ggml-cuda enables the CUDA language.
string(APPEND CMAKE_CUDA_FLAGS_INIT " -isystem ${AURAL_CUBLAS_ROOT}/include")
# ggml-python installs libggml-cuda.so twice, in site-packages/bin and site-packages/ggml/lib (Aural loads the
# first it finds): from either it finds the wheel's libraries (site-packages/nvidia/cu13/lib). Elsewhere (a
# --target install on the device machine) LD_LIBRARY_PATH names them.
list(APPEND CMAKE_INSTALL_RPATH "$ORIGIN/../nvidia/cu13/lib" "$ORIGIN/../../nvidia/cu13/lib")
