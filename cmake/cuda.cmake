# CUDA backend (kernels/cuda, src/backend/backend_cuda.cu) and NCCL communication
# (src/comm/comm_nccl.cpp). Included by the top-level CMakeLists.txt after src/, whose rooms it
# links into. Builds only where nvcc is found and NCCL is installed; -DNTPBENCH_CUDA=OFF skips it.
# Sets NTPBENCH_HAVE_CUDA (a CMake variable, for tests/) and the compile definition of the same
# name on ntp_backend (so on every room above it): make_backend("cuda", ...) then dispatches to
# make_cuda_backend().
option(NTPBENCH_CUDA "Build the CUDA backend where nvcc exists" ON)

if(NTPBENCH_CUDA)
  include(CheckLanguage)
  check_language(CUDA)
  if(NOT CMAKE_CUDA_COMPILER)
    message(STATUS "CUDA backend: off (no nvcc found)")
  else()
    # Default architectures: A100 (80) and H100/H200 (90); override with -DCMAKE_CUDA_ARCHITECTURES=...
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES "80;90" CACHE STRING "CUDA architectures to build for")
    endif()
    enable_language(CUDA)
    find_package(CUDAToolkit REQUIRED)

    # NCCL: headers and library, from NCCL_ROOT / NCCL_HOME, the CUDA toolkit, or the system.
    find_path(NCCL_INCLUDE_DIR nccl.h
              HINTS $ENV{NCCL_ROOT} $ENV{NCCL_HOME} ${NCCL_ROOT} ${CUDAToolkit_LIBRARY_ROOT}
                    ${CUDAToolkit_INCLUDE_DIRS}
              PATH_SUFFIXES include)
    find_library(NCCL_LIBRARY nccl
                 HINTS $ENV{NCCL_ROOT} $ENV{NCCL_HOME} ${NCCL_ROOT} ${CUDAToolkit_LIBRARY_ROOT}
                       ${CUDAToolkit_LIBRARY_DIR}
                 PATH_SUFFIXES lib lib64 lib/x86_64-linux-gnu)
    if(NOT NCCL_INCLUDE_DIR OR NOT NCCL_LIBRARY)
      message(STATUS "CUDA backend: off (NCCL not found: set NCCL_ROOT, or install libnccl-dev)")
    else()
      if(NOT TARGET NCCL::nccl)
        add_library(NCCL::nccl UNKNOWN IMPORTED)
        set_target_properties(NCCL::nccl PROPERTIES IMPORTED_LOCATION ${NCCL_LIBRARY}
                              INTERFACE_INCLUDE_DIRECTORIES ${NCCL_INCLUDE_DIR})
      endif()

      file(GLOB KERNEL_CUDA_SOURCES CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/kernels/cuda/*.cu
           ${CMAKE_SOURCE_DIR}/kernels/cuda/detail/*.cu)
      add_library(ntp_kernels_cuda STATIC ${KERNEL_CUDA_SOURCES} ${CMAKE_SOURCE_DIR}/src/backend/backend_cuda.cu)
      # C++17 for the .cu sources: nvcc 13 takes C++20, but CMake 3.25 does not know nvcc 13's
      # C++20 flag; the engine headers the .cu files include (backend.hpp) are C++17-clean.
      set_target_properties(ntp_kernels_cuda PROPERTIES CUDA_STANDARD 17 CUDA_STANDARD_REQUIRED ON
                            CUDA_EXTENSIONS OFF CUDA_RUNTIME_LIBRARY Shared POSITION_INDEPENDENT_CODE ON)
      target_include_directories(ntp_kernels_cuda PUBLIC ${CMAKE_SOURCE_DIR} ${CMAKE_SOURCE_DIR}/src/backend)
      # The directory's add_compile_options (-Wall -Wextra) are host-compiler flags: nvcc takes
      # them through -Xcompiler, so keep them for the C++ source only and pass them on for .cu.
      get_target_property(_ntp_opts ntp_kernels_cuda COMPILE_OPTIONS)
      set(_ntp_cxx_opts)
      if(_ntp_opts)
        foreach(_o IN LISTS _ntp_opts)
          list(APPEND _ntp_cxx_opts $<$<COMPILE_LANGUAGE:CXX>:${_o}>)
        endforeach()
      endif()
      set_property(TARGET ntp_kernels_cuda PROPERTY COMPILE_OPTIONS ${_ntp_cxx_opts})
      target_compile_options(ntp_kernels_cuda PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall,-Wextra>)
      target_link_libraries(ntp_kernels_cuda PUBLIC CUDA::cudart CUDA::cublas)

      # NCCL communication builds on the MPI comm (make_mpi_comm in src/comm/comm_mpi.cpp), so it
      # is a library of its own, linked by the program's main only. Inside ntp_kernels_cuda, the linker
      # could pull it into test_cuda (kernels without the engine) for an inline std::string member
      # it happens to define, and then fail on make_mpi_comm.
      add_library(ntp_comm_nccl STATIC ${CMAKE_SOURCE_DIR}/src/comm/comm_nccl.cpp)
      target_link_libraries(ntp_comm_nccl PUBLIC ntp_comm CUDA::cudart NCCL::nccl)

      target_link_libraries(ntp_backend PUBLIC ntp_kernels_cuda)
      target_compile_definitions(ntp_backend PUBLIC NTPBENCH_HAVE_CUDA)
      target_link_libraries(ntp_engine INTERFACE ntp_comm_nccl)
      target_link_libraries(ntpbench PRIVATE ntp_comm_nccl)
      set(NTPBENCH_HAVE_CUDA ON)
      message(STATUS "CUDA backend: on (nvcc ${CMAKE_CUDA_COMPILER_VERSION}, architectures "
                     "${CMAKE_CUDA_ARCHITECTURES}, NCCL ${NCCL_LIBRARY})")
    endif()
  endif()
else()
  message(STATUS "CUDA backend: off (NTPBENCH_CUDA=${NTPBENCH_CUDA})")
endif()
