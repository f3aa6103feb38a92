# -*- coding: utf-8 -*-
"""The environment variables NCCL, torch and their neighbours read, and the pure helpers of role nccl_env.

Used on the controller by action_plugins/nccl_env_validate.py (names and values, before anything is written) and
filter_plugins/render.py (the across-nodes consistency check). Stdlib only; unit-tested in
tests/unit/plugin_utils/test_nccl_vars.py, tests/unit/actions/test_nccl_env_render.py.

Where the names come from: every NUL-terminated NCCL_*/TORCH_*/PYTORCH_*/TORCHELASTIC_*/GLOO_*/CUDA_*/OMP_*
string in the shared libraries of torch 2.11.0+cu130 and NCCL 2.28 (libnccl.so.2, libtorch_cpu/cuda/python.so,
libc10*.so, libgomp) and every such quoted name in torch's Python sources, captured on the H100/H200 machines,
minus C macro and enum names (CUDA_ERROR_*, TORCH_CHECK, NCCL_LOG_*, ...); plus names older NCCL and torch
releases still document (NCCL_ASYNC_ERROR_HANDLING, NCCL_LL_THRESHOLD, ...), the rendezvous and launcher names
torchrun and DeepSpeed read, and the usual Hugging Face / logging names. A name outside these lists is allowed
only through nccl_env_allow_unknown (names or shell-style patterns such as MYLAB_*).

The components under NCCL (libfabric, aws-ofi-nccl, the GPUDirect-TCPX/TCPXO plugins, UCX, SHARP and the
NCCL-RDMA-SHARP plugin): each list below names the repository, commit and files it was read from (their own source,
or for closed components the public launch scripts that use them); docs/bring-your-own.md repeats the sources.
REMOVED holds the names a component stops on, with the replacement.
"""

from __future__ import annotations

import difflib
import fnmatch
import hashlib
import re
from collections import Counter

from ansible_collections.trainyard.core.plugins.plugin_utils.did_you_mean import nearest

_NCCL = """
    NCCL_ALGO NCCL_ALLOC_P2P_NET_LL_BUFFERS NCCL_ASYNC_ERROR_HANDLING NCCL_BLOCKING_WAIT NCCL_BUFFSIZE
    NCCL_CGA_CLUSTER_SIZE NCCL_CHECKS_DISABLE NCCL_CHECK_POINTERS NCCL_CHECK_TIMEOUT NCCL_CHUNK_SIZE
    NCCL_COLLNET_ENABLE NCCL_COLLNET_NODE_THRESHOLD NCCL_COMM_BLOCKING NCCL_COMM_ID
    NCCL_COMM_SHRINK_SHARE_RESOURCES NCCL_COMM_SPLIT_SHARE_RESOURCES NCCL_CONF_FILE NCCL_CONNECT_ROUND_MAX_PEERS
    NCCL_CREATE_THREAD_CONTEXT NCCL_CROSS_NIC NCCL_CTA_POLICY NCCL_CUMEM_ENABLE NCCL_CUMEM_HOST_ENABLE
    NCCL_DEBUG NCCL_DEBUG_FILE NCCL_DEBUG_SUBSYS NCCL_DEBUG_TIMESTAMP_FORMAT NCCL_DEBUG_TIMESTAMP_LEVELS
    NCCL_DESYNC_DEBUG NCCL_DMABUF_ENABLE NCCL_ENV_PLUGIN NCCL_GDRCOPY_ENABLE NCCL_GDRCOPY_FIFO_ENABLE
    NCCL_GDRCOPY_FLUSH_ENABLE NCCL_GDRCOPY_SYNC_ENABLE NCCL_GDR_FLUSH_DISABLE NCCL_GIN_COUNTER_POOL_SIZE
    NCCL_GIN_ENABLE NCCL_GIN_ERROR_QUERY_SEC NCCL_GIN_GDAKI_NIC_HANDLER NCCL_GIN_GDAKI_QP_DEPTH
    NCCL_GIN_IB_ALLGATHER_TAG NCCL_GIN_IB_ALLTOALL_TAG NCCL_GIN_NCONTEXTS NCCL_GIN_PROXY_QUEUE_SIZE
    NCCL_GIN_SIGNAL_POOL_SIZE NCCL_GIN_TYPE NCCL_GRAPH_DUMP_FILE NCCL_GRAPH_DUMP_FILE_RANK NCCL_GRAPH_FILE
    NCCL_GRAPH_HELPER_DISABLE NCCL_GRAPH_MIXING_SUPPORT NCCL_GRAPH_REGISTER NCCL_GROUP_CUDA_STREAM NCCL_HOSTID
    NCCL_IB_ADAPTIVE_ROUTING NCCL_IB_ADDR_FAMILY NCCL_IB_ADDR_RANGE NCCL_IB_AR_THRESHOLD NCCL_IB_CUDA_SUPPORT
    NCCL_IB_DATA_DIRECT NCCL_IB_DISABLE NCCL_IB_ECE_ENABLE NCCL_IB_FIFO_TC NCCL_IB_GDR_LEVEL NCCL_IB_GID_INDEX
    NCCL_IB_HCA NCCL_IB_MERGE_NICS NCCL_IB_MERGE_VFS NCCL_IB_MQP_RETRY_ALL NCCL_IB_MQP_RETRY_CNT
    NCCL_IB_MQP_RETRY_SLEEP_MSEC NCCL_IB_PCI_RELAXED_ORDERING NCCL_IB_PKEY NCCL_IB_QPS_PER_CONNECTION
    NCCL_IB_RETRY_CNT NCCL_IB_RETURN_ASYNC_EVENTS NCCL_IB_ROCE_VERSION_NUM NCCL_IB_ROUTABLE_FLID_GID_INDEX
    NCCL_IB_SL NCCL_IB_SPLIT_DATA_ON_QPS NCCL_IB_TC NCCL_IB_TIMEOUT NCCL_IB_USE_INLINE NCCL_IB_WARN_RAIL_LOCAL
    NCCL_IGNORE_CPU_AFFINITY NCCL_IGNORE_DISABLED_P2P NCCL_L1_SHARED_MEMORY_CARVEOUT NCCL_LAUNCH_MODE
    NCCL_LAUNCH_ORDER_IMPLICIT NCCL_LAUNCH_RACE_FATAL NCCL_LEGACY_CUDA_REGISTER NCCL_LL128_BUFFSIZE
    NCCL_LL128_C2C NCCL_LL128_NTHREADS NCCL_LL_BUFFSIZE NCCL_LL_THRESHOLD NCCL_LOCAL_REGISTER NCCL_MAX_CTAS
    NCCL_MAX_NCHANNELS NCCL_MAX_NRINGS NCCL_MAX_P2P_NCHANNELS NCCL_MEM_SYNC_DOMAIN NCCL_MIN_CTAS
    NCCL_MIN_NCHANNELS NCCL_MIN_NRINGS NCCL_MIN_P2P_NCHANNELS NCCL_MNNVL_CLIQUE_ID NCCL_MNNVL_ENABLE
    NCCL_MNNVL_RAIL_PER_HOST NCCL_MNNVL_SCATTER_NETS_ENABLE NCCL_MNNVL_UUID NCCL_NCHANNELS_PER_NET_PEER NCCL_NET
    NCCL_NETDEVS_POLICY NCCL_NET_DISABLE_INTRA NCCL_NET_FORCE_FLUSH NCCL_NET_FORCE_MERGE NCCL_NET_GDR_C2C
    NCCL_NET_GDR_LEVEL NCCL_NET_GDR_READ NCCL_NET_MERGE_LEVEL NCCL_NET_OPTIONAL_RECV_COMPLETION
    NCCL_NET_OVERHEAD NCCL_NET_PLUGIN NCCL_NET_PLUGIN_REF_COUNT NCCL_NET_SHARED_BUFFERS NCCL_NET_SHARED_COMMS
    NCCL_NSOCKS_PERTHREAD NCCL_NTHREADS NCCL_NVB_DISABLE NCCL_NVB_PRECONNECT
    NCCL_NVLINK_UTIL_CENTRIC_SCHED_ENABLE NCCL_NVLSTREE_MAX_CHUNKSIZE NCCL_NVLS_CHUNKSIZE NCCL_NVLS_ENABLE
    NCCL_NVLS_NCHANNELS NCCL_NVTX_DISABLE NCCL_OOB_NET_ENABLE NCCL_OOB_NET_IFNAME NCCL_P2P_DIRECT_DISABLE
    NCCL_P2P_DISABLE NCCL_P2P_LEVEL NCCL_P2P_LL_THRESHOLD NCCL_P2P_NET_CHUNKSIZE NCCL_P2P_NVL_CHUNKSIZE
    NCCL_P2P_PCI_CHUNKSIZE NCCL_P2P_PXN_LEVEL NCCL_P2P_READ_ENABLE NCCL_P2P_SCHEDULE_GROUP_SIZE
    NCCL_P2P_USE_CUDA_MEMCPY NCCL_PAT_ENABLE NCCL_PROFILER_PLUGIN NCCL_PROGRESS_APPENDOP_FREQ NCCL_PROTO
    NCCL_PROXY_APPEND_BATCH_SIZE NCCL_PROXY_CPUSET NCCL_PROXY_DUMP_SIGNAL NCCL_PROXY_PROFILE NCCL_PXN_C2C
    NCCL_PXN_DISABLE NCCL_RAS_ADDR NCCL_RAS_ENABLE NCCL_RAS_TIMEOUT_FACTOR NCCL_REPORT_CONNECT_PROGRESS
    NCCL_RINGS NCCL_RUNTIME_CONNECT NCCL_SET_CPU_STACK_SIZE NCCL_SET_STACK_SIZE NCCL_SET_THREAD_NAME
    NCCL_SHM_DISABLE NCCL_SHM_LOCALITY NCCL_SHM_MEMCPY_MODE NCCL_SHM_USE_CUDA_MEMCPY
    NCCL_SINGLE_PROC_MEM_REG_ENABLE NCCL_SINGLE_RING_THRESHOLD NCCL_SOCKET_FAMILY NCCL_SOCKET_IFNAME
    NCCL_SOCKET_INLINE NCCL_SOCKET_MIN_TASKSIZE NCCL_SOCKET_NTHREADS NCCL_SOCKET_RCVBUF NCCL_SOCKET_RETRY_CNT
    NCCL_SOCKET_RETRY_SLEEP_MSEC NCCL_SOCKET_SNDBUF NCCL_SYM_CTAS NCCL_SYM_KERNEL NCCL_THREAD_THRESHOLDS
    NCCL_TOPO_DUMP_FILE NCCL_TOPO_DUMP_FILE_RANK NCCL_TOPO_FILE NCCL_TREE_THRESHOLD NCCL_TUNER_PLUGIN
    NCCL_UID_STAGGER_RATE NCCL_UID_STAGGER_THRESHOLD NCCL_UNPACK_DOUBLE_NCHANNELS
    NCCL_USE_TENSOR_REGISTER_ALLOCATOR_HOOK NCCL_WARN_ENABLE_DEBUG_INFO NCCL_WIN_ENABLE NCCL_WIN_STRIDE
    NCCL_WORK_ARGS_BYTES NCCL_WORK_FIFO_BYTES NCCL_WORK_FIFO_DEPTH
"""

_TORCH = """
    PYTORCH_ALLOC_CONF PYTORCH_API_USAGE_STDERR PYTORCH_CUDA_ALLOC_CONF PYTORCH_CUDA_DSA_STACKTRACING
    PYTORCH_CUDA_MEMCHECK PYTORCH_DDP_USE_SIDE_STREAM PYTORCH_DEBUG_FLASH_ATTENTION_GCN_ARCH_OVERRIDE
    PYTORCH_DISABLE_RUNNING_SCRIPT_CHK PYTORCH_FUSION_DEBUG PYTORCH_GEN_PATTERNS PYTORCH_HIP_ALLOC_CONF
    PYTORCH_HYPOTHESIS_PROFILE PYTORCH_JIT PYTORCH_JIT_DISABLE PYTORCH_JIT_ENABLE_LARGE_SOURCE_LOCATION
    PYTORCH_JIT_LOG_LEVEL PYTORCH_JIT_OPT_LIMIT PYTORCH_JIT_STATS PYTORCH_JIT_TIME PYTORCH_JIT_TYPE_VERBOSITY
    PYTORCH_KEEP_TMPDIR PYTORCH_KERNEL_CACHE_PATH PYTORCH_MATCHER_LOGLEVEL PYTORCH_MIOPEN_SUGGEST_NHWC
    PYTORCH_MIOPEN_SUGGEST_NHWC_BATCHNORM PYTORCH_NO_CUDA_MEMORY_CACHING PYTORCH_NO_HIP_MEMORY_CACHING
    PYTORCH_NVCC PYTORCH_NVML_BASED_CUDA_CHECK PYTORCH_PRINT_REPRO_ON_FAILURE PYTORCH_REORDER_COLLECTIVES_LIMIT
    PYTORCH_ROCM_ARCH PYTORCH_SINK_WAITS_LIMIT PYTORCH_SKIP_CUDNN_COMPATIBILITY_CHECK PYTORCH_TENSOREXPR
    PYTORCH_TENSOREXPR_DONT_FUSE PYTORCH_TENSOREXPR_FALLBACK PYTORCH_TENSOREXPR_RANDOM_TRANSFORM_SEED
    PYTORCH_TUNABLEOP_BLAS_LOG PYTORCH_TUNABLEOP_ENABLED PYTORCH_TUNABLEOP_FILENAME
    PYTORCH_TUNABLEOP_ICACHE_FLUSH_ENABLED PYTORCH_TUNABLEOP_MAX_TUNING_DURATION_MS
    PYTORCH_TUNABLEOP_MAX_TUNING_ITERATIONS PYTORCH_TUNABLEOP_MAX_WARMUP_DURATION_MS
    PYTORCH_TUNABLEOP_MAX_WARMUP_ITERATIONS PYTORCH_TUNABLEOP_NUMERICAL_CHECK PYTORCH_TUNABLEOP_RECORD_UNTUNED
    PYTORCH_TUNABLEOP_ROTATING_BUFFER_SIZE PYTORCH_TUNABLEOP_TUNING PYTORCH_TUNABLEOP_UNTUNED_FILENAME
    PYTORCH_TUNABLEOP_VERBOSE PYTORCH_TUNABLEOP_VERBOSE_FILENAME PYTORCH_USE_CUDA_DSA
    TORCHELASTIC_ENABLE_FILE_TIMER TORCHELASTIC_ERROR_FILE TORCHELASTIC_ETCD_BINARY_PATH
    TORCHELASTIC_HEALTH_CHECK_PORT TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE TORCHELASTIC_MAX_RESTARTS
    TORCHELASTIC_RESTART_COUNT TORCHELASTIC_RUN_ID TORCHELASTIC_SIGNALS_TO_HANDLE TORCHELASTIC_TIMER_FILE
    TORCHELASTIC_USE_AGENT_STORE TORCH_ADDR2LINE_BINARY TORCH_ALLOW_TF32_CUBLAS_OVERRIDE
    TORCH_AUTOGRAD_SHUTDOWN_WAIT_LIMIT TORCH_BISECT_BACKEND TORCH_BISECT_MAX TORCH_BISECT_SUBSYSTEM
    TORCH_BLAS_PREFER_CUBLASLT TORCH_BLAS_PREFER_HIPBLASLT TORCH_CACHING_PRECOMPILE TORCH_COMPILER_COLLECTIVES
    TORCH_COMPILE_BACKEND TORCH_COMPILE_CACHE_KEY_TAG TORCH_COMPILE_CPROFILE TORCH_COMPILE_DEBUG
    TORCH_COMPILE_DEBUG_DIR TORCH_COMPILE_DEBUG_SAVE_REAL TORCH_COMPILE_DISABLE TORCH_COMPILE_DYNAMIC_SOURCES
    TORCH_COMPILE_DYNAMO_PROFILER TORCH_COMPILE_FORCE_DISABLE_CACHES TORCH_COMPILE_GRAPH_FORMAT
    TORCH_COMPILE_JOB_ID TORCH_COMPILE_OVERRIDE_BACKENDS TORCH_COMPILE_OVERRIDE_INDUCTOR_CONFIGS
    TORCH_COMPILE_REPLAY_RECORD TORCH_COMPILE_STICKY_PGO_KEY TORCH_COMPILE_STICKY_PGO_READ
    TORCH_COMPILE_STICKY_PGO_WRITE TORCH_COMPILE_STROBELIGHT TORCH_COMPILE_UNBACKED_SOURCES
    TORCH_COMPILE_USE_LAZY_GRAPH_MODULE TORCH_CPP_LOG_LEVEL TORCH_CUBLASLT_UNIFIED_WORKSPACE TORCH_CUDAGRAPH_GC
    TORCH_CUDA_ARCH_LIST TORCH_CUDA_EXPANDABLE_SEGMENTS_IPC TORCH_CUDA_SANITIZER
    TORCH_CUDNN_SDPA_AVOID_RECOMPILE TORCH_CUDNN_SDPA_CACHE_DEBUG TORCH_CUDNN_SDPA_DEPRIORITIZED
    TORCH_CUDNN_SDPA_NESTED_TENSOR_ENABLED TORCH_CUDNN_USE_HEURISTIC_MODE_B TORCH_CUDNN_V8_API_DEBUG
    TORCH_CUDNN_V8_API_DISABLED TORCH_CUDNN_V8_API_LRU_CACHE_LIMIT TORCH_CUSTOM_PYTHONPATH
    TORCH_CUSTOM_TERMINATE TORCH_DEVICE_BACKEND_AUTOLOAD TORCH_DISABLE_ADDR2LINE
    TORCH_DISABLE_DEADLOCK_DETECTION TORCH_DISABLE_FUNCTIONALIZATION_META_REFERENCE
    TORCH_DISABLE_SHARE_RDZV_TCP_STORE TORCH_DISTRIBUTED_COMPILE_ON_ONE_RANK TORCH_DISTRIBUTED_DEBUG
    TORCH_DISTRIBUTED_USE_TORCHCOMMS TORCH_DIST_INIT_BARRIER TORCH_DONT_CHECK_COMPILER_ABI
    TORCH_DYNAMO_AUTOMATIC_DYNAMIC_LOCAL_PGO TORCH_DYNAMO_AUTOMATIC_DYNAMIC_REMOTE_PGO
    TORCH_DYNAMO_AUTOMATIC_DYNAMIC_SHAPES TORCH_DYNAMO_DO_NOT_EMIT_RUNTIME_ASSERTS
    TORCH_DYNAMO_RUN_GC_AFTER_COMPILE TORCH_ELASTIC_WORKER_IDENTICAL TORCH_EXTENSIONS_DIR
    TORCH_FAKE_TENSOR_DEBUG TORCH_FAKE_TENSOR_DISPATCH_CACHE TORCH_FAKE_TENSOR_DISPATCH_CACHE_CROSSCHECK
    TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD TORCH_FORCE_WEIGHTS_ONLY_LOAD TORCH_FR_BUFFER_SIZE TORCH_FR_CPP_STACK
    TORCH_FR_DUMP_DYNAMIC_FILE_NAME TORCH_FR_DUMP_TEMP_FILE TORCH_GLOO_LAZY_INIT TORCH_HIP_VERSION TORCH_HOME
    TORCH_HUB TORCH_INCLUDE_ONLY_ACTIVE TORCH_INCLUDE_STACK_TRACE TORCH_INDUCTOR_CPP_WRAPPER
    TORCH_INDUCTOR_INSTALL_GXX TORCH_LINALG_PREFER_CUSOLVER TORCH_LINALG_PREFER_HIPSOLVER
    TORCH_LINEAR_FLATTEN_3D TORCH_LOGS TORCH_LOGS_FORMAT TORCH_LOGS_OUT TORCH_LOGS_TRACE_ID_FILTER
    TORCH_MKLDNN_MATMUL_MIN_DIM TORCH_MKLDNN_MATMUL_MIN_SIZE TORCH_MODEL_ZOO TORCH_MP_PARALLEL_START
    TORCH_NCCL_ASYNC_ERROR_HANDLING TORCH_NCCL_AVOID_RECORD_STREAMS TORCH_NCCL_BCAST_UNIQUEID
    TORCH_NCCL_BLOCKING_WAIT TORCH_NCCL_COORD_CHECK_MILSEC TORCH_NCCL_CUDA_EVENT_CACHE
    TORCH_NCCL_DEBUG_INFO_PIPE_FILE TORCH_NCCL_DEBUG_INFO_TEMP_FILE TORCH_NCCL_DESYNC_DEBUG
    TORCH_NCCL_DUMP_ON_TIMEOUT TORCH_NCCL_ENABLE_MONITORING TORCH_NCCL_ENABLE_TIMING
    TORCH_NCCL_EXTRA_DUMP_ON_EXEC TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC TORCH_NCCL_HIGH_PRIORITY
    TORCH_NCCL_LOG_CPP_STACK_ON_UNCLEAN_SHUTDOWN TORCH_NCCL_NAN_CHECK TORCH_NCCL_NONBLOCKING_TIMEOUT
    TORCH_NCCL_PROPAGATE_ERROR TORCH_NCCL_RANKS_PER_ROOT TORCH_NCCL_RETHROW_CUDA_ERRORS
    TORCH_NCCL_SHOW_EAGER_INIT_P2P_SERIALIZATION_WARNING TORCH_NCCL_TRACE_BUFFER_SIZE TORCH_NCCL_TRACE_CPP_STACK
    TORCH_NCCL_USE_COMM_NONBLOCKING TORCH_NCCL_USE_TENSOR_REGISTER_ALLOCATOR_HOOK
    TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC TORCH_ONNX_ENABLE_DRAFT_EXPORT
    TORCH_ONNX_PREFER_DEFERRED_RUNTIME_ASSERTS_OVER_GUARDS TORCH_PROFILER_ENABLE_COLLECTIVE_PROFILING
    TORCH_ROCM_AOTRITON_ENABLE_EXPERIMENTAL TORCH_ROCM_FA_PREFER_CK TORCH_SERIALIZATION_DEBUG
    TORCH_SHOW_CPP_STACKTRACES TORCH_SHOW_DISPATCH_TRACE TORCH_SPARSE_BSR_SCATTER_MM_LRU_CACHE_SIZE
    TORCH_STRICT_PRECOMPILE TORCH_SYMBOLIZE_MODE TORCH_SYMMMEM TORCH_SYMMMEM_IMPLICIT_POOL TORCH_SYMMMEM_NBLOCKS
    TORCH_SYMM_MEM_ALLOW_OVERLAPPING_DEVICES TORCH_SYMM_MEM_DISABLE_MULTICAST
    TORCH_SYMM_MEM_ENABLE_NATIVE_ASYNC_TP TORCH_TEST_DEVICES TORCH_TRACE TORCH_USE_RTLD_GLOBAL TORCH_WARM_POOL
    TORCH_WORKER_SERVER_SOCKET TORCH_XPU_ARCH_LIST
"""

_GLOO_CUDA_OMP = """
    CUDA_ENABLE_MODULE_LAZY_LOADING CUDA_HOME CUDA_INC_PATH CUDA_LAUNCH_BLOCKING CUDA_MODULE_LOADING CUDA_PATH
    CUDA_VERSION CUDA_VISIBLE_DEVICES GLOO_ASYNC_TIMEOUT_DEBUG GLOO_DEVICE_TRANSPORT
    GLOO_DEVICE_TRANSPORT_TCP_TLS_CA_FILE GLOO_DEVICE_TRANSPORT_TCP_TLS_CA_PATH
    GLOO_DEVICE_TRANSPORT_TCP_TLS_CERT GLOO_DEVICE_TRANSPORT_TCP_TLS_PKEY GLOO_DISABLE_CONNECTION_RETRIES
    GLOO_ENABLE_RANK_AS_SEQUENCE_NUMBER GLOO_ENABLE_STORE_V2_API GLOO_LOG_LEVEL GLOO_SOCKET_IFNAME
    OMP_AFFINITY_FORMAT OMP_CANCELLATION OMP_DEFAULT_DEVICE OMP_DISPLAY_AFFINITY OMP_DISPLAY_ENV OMP_DYNAMIC
    OMP_MAX_ACTIVE_LEVELS OMP_MAX_TASK_PRIORITY OMP_NESTED OMP_NUM_THREADS OMP_PLACES OMP_PROC_BIND OMP_SCHEDULE
    OMP_THREAD_LIMIT OMP_WAIT_POLICY
"""

# Read by the CUDA driver and runtime, launchers, rendezvous, DeepSpeed, Hugging Face and logging: names a training job commonly reads.
_OTHER = """
    MASTER_ADDR MASTER_PORT WORLD_SIZE RANK LOCAL_RANK LOCAL_WORLD_SIZE GROUP_RANK GROUP_WORLD_SIZE ROLE_RANK
    ROLE_WORLD_SIZE NNODES NODE_RANK NPROC_PER_NODE
    PET_NNODES PET_NPROC_PER_NODE PET_NODE_RANK PET_MASTER_ADDR PET_MASTER_PORT PET_RDZV_BACKEND PET_RDZV_ENDPOINT
    PET_RDZV_ID PET_RDZV_CONF PET_MAX_RESTARTS PET_MONITOR_INTERVAL PET_START_METHOD PET_LOG_DIR PET_TEE PET_REDIRECTS
    CUDA_DEVICE_ORDER CUDA_DEVICE_MAX_CONNECTIONS CUDA_MODULE_LOADING CUDA_MPS_ACTIVE_THREAD_PERCENTAGE
    CUDA_DISABLE_PERF_BOOST CUDA_ENABLE_COREDUMP_ON_EXCEPTION CUDA_COREDUMP_FILE CUDA_DEVICE_WAITS_ON_EXCEPTION
    CUDA_MANAGED_FORCE_DEVICE_ALLOC CUDA_SCALE_LAUNCH_QUEUES CUDA_LOG_FILE CUBLAS_WORKSPACE_CONFIG CUBLASLT_LOG_LEVEL
    CUDNN_LOGLEVEL_DBG CUDNN_LOGDEST_DBG CUDA_CACHE_PATH CUDA_CACHE_MAXSIZE CUDA_CACHE_DISABLE
    CUDA_FORCE_PTX_JIT CUDA_AUTO_BOOST CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
    NVIDIA_VISIBLE_DEVICES NVIDIA_DRIVER_CAPABILITIES NVIDIA_TF32_OVERRIDE
    DEEPSPEED_TIMEOUT DS_ACCELERATOR DS_SKIP_CUDA_CHECK DS_BUILD_OPS
    MKL_NUM_THREADS OPENBLAS_NUM_THREADS NUMEXPR_NUM_THREADS KMP_AFFINITY KMP_BLOCKTIME
    HF_HOME HF_HUB_CACHE HF_DATASETS_CACHE HF_HUB_OFFLINE HF_DATASETS_OFFLINE HF_HUB_ENABLE_HF_TRANSFER
    HF_HUB_DISABLE_TELEMETRY HF_HUB_DISABLE_PROGRESS_BARS HF_HUB_ETAG_TIMEOUT TRANSFORMERS_CACHE
    TRANSFORMERS_OFFLINE
    TRANSFORMERS_VERBOSITY TOKENIZERS_PARALLELISM ACCELERATE_LOG_LEVEL TENSORBOARD_LOGGING_DIR
    WANDB_MODE WANDB_DISABLED WANDB_PROJECT WANDB_DIR WANDB_SILENT
    PYTHONUNBUFFERED PYTHONFAULTHANDLER PYTHONHASHSEED PYTHONPATH PYTHONDONTWRITEBYTECODE LOGLEVEL
    LD_LIBRARY_PATH LD_PRELOAD PATH
    TRAINYARD_COLLECTIVE_TIMEOUT_S TRAINYARD_RESUME_FROM TRAINYARD_PROGRESS_DIR
"""

# libfabric (FI_*), from ofiwg/libfabric's source at the tags v1.14.0 ... v2.6.0 (every fi_param_define() of the
# core, efa, shm, tcp, rxm providers and every vrb_get_param_*() of verbs, prefixed FI_ / FI_EFA_ / FI_SHM_ /
# FI_TCP_ / FI_OFI_RXM_ / FI_VERBS_ as fi_param_get() builds the name (man/fi_tcp.7.md, fi_rxm.7.md, fi_shm.7.md
# document them under these names), the FI_* names src/ and prov/efa read with getenv(), and FI_SOCKETS_IFACE
# (prov/sockets/src/sock_fabric.c). Older releases' names stay: libfabric ignores a name it does not read.
_LIBFABRIC = """
    FI_AV_REMOVE_CLEANUP FI_EFA_CQ_SIZE FI_EFA_EFA_CQ_READ_SIZE FI_EFA_ENABLE_HIGH_PPS FI_EFA_ENABLE_SHM_TRANSFER
    FI_EFA_FORK_SAFE FI_EFA_IFACE FI_EFA_IMPLICIT_AV_SIZE FI_EFA_INTERNAL_RX_REFILL_THRESHOLD
    FI_EFA_INTER_MAX_GDRCOPY_MESSAGE_SIZE FI_EFA_INTER_MAX_MEDIUM_MESSAGE_SIZE FI_EFA_INTER_MIN_READ_MESSAGE_SIZE
    FI_EFA_INTER_MIN_READ_WRITE_SIZE FI_EFA_INTER_READ_SEGMENT_SIZE FI_EFA_MAX_MEMCPY_SIZE FI_EFA_MAX_TIMEOUT
    FI_EFA_MR_CACHE_ENABLE FI_EFA_MR_MAX_CACHED_COUNT FI_EFA_MR_MAX_CACHED_SIZE FI_EFA_MTU_SIZE
    FI_EFA_READCOPY_POOL_SIZE FI_EFA_RECVWIN_SIZE FI_EFA_RUNT_SIZE FI_EFA_RX_COPY_OOO FI_EFA_RX_COPY_UNEXP
    FI_EFA_RX_IOV_LIMIT FI_EFA_RX_SIZE FI_EFA_RX_WINDOW_SIZE FI_EFA_SET_CUDA_SYNC_MEMOPS FI_EFA_SHM_AV_SIZE
    FI_EFA_SHM_CQ_READ_SIZE FI_EFA_SHM_MAX_MEDIUM_SIZE FI_EFA_TIMEOUT_INTERVAL FI_EFA_TRACK_MR FI_EFA_TX_IOV_LIMIT
    FI_EFA_TX_MAX_CREDITS FI_EFA_TX_MIN_CREDITS FI_EFA_TX_QUEUE_SIZE FI_EFA_TX_SIZE FI_EFA_USE_DATA_PATH_DIRECT
    FI_EFA_USE_DEVICE_RDMA FI_EFA_USE_HUGE_PAGE FI_EFA_USE_HW_CNTR FI_EFA_USE_SM2 FI_EFA_USE_UNSOLICITED_WRITE_RECV
    FI_EFA_USE_ZCPY_RX FI_EFA_ZCPY_RX_SEED FI_FORK_UNSAFE FI_HMEM FI_HMEM_CUDA_ENABLE_XFER FI_HMEM_CUDA_USE_DMABUF
    FI_HMEM_CUDA_USE_GDRCOPY FI_HMEM_DISABLE_P2P FI_HMEM_NEURON_USE_DMABUF FI_HMEM_ROCR_USE_DMABUF
    FI_HMEM_SYNAPSEAI_USE_DMABUF FI_HMEM_ZE_COPY_ENGINE FI_HMEM_ZE_USE_DMABUF FI_HOOK FI_LOG_INTERVAL FI_LOG_LEVEL
    FI_LOG_LOCATION FI_LOG_LOCATION_MODE FI_LOG_PROV FI_LOG_SUBSYS FI_MR_CACHE_MAX_COUNT FI_MR_CACHE_MAX_SIZE
    FI_MR_CACHE_MONITOR FI_MR_CUDA_CACHE_MONITOR_ENABLED FI_MR_ROCR_CACHE_MONITOR_ENABLED
    FI_MR_ZE_CACHE_MONITOR_ENABLED FI_OFFLOAD_COLL_PROVIDER FI_OFI_RXM_BUFFER_SIZE FI_OFI_RXM_CM_PROGRESS_INTERVAL
    FI_OFI_RXM_COMP_PER_PROGRESS FI_OFI_RXM_CQ_EQ_FAIRNESS FI_OFI_RXM_DATA_AUTO_PROGRESS FI_OFI_RXM_DEF_TCP_WAIT_OBJ
    FI_OFI_RXM_DEF_WAIT_OBJ FI_OFI_RXM_DETECT_HMEM_IFACE FI_OFI_RXM_EAGER_LIMIT FI_OFI_RXM_ENABLE_DIRECT_SEND
    FI_OFI_RXM_ENABLE_DYN_RBUF FI_OFI_RXM_ENABLE_PASSTHRU FI_OFI_RXM_MSG_RX_SIZE FI_OFI_RXM_MSG_TX_SIZE
    FI_OFI_RXM_RESCAN FI_OFI_RXM_RX_SIZE FI_OFI_RXM_SAR_LIMIT FI_OFI_RXM_TX_SIZE FI_OFI_RXM_USE_RNDV_WRITE
    FI_OFI_RXM_USE_SRX FI_PERF_CNTR FI_POLL_FAIRNESS FI_PREFER_SYSCONFIG FI_PROVIDER FI_PROVIDER_PATH
    FI_ROCR_D2H_THRESHOLD FI_SHM_BUFFER_THRESHOLD FI_SHM_DISABLE_CMA FI_SHM_ENABLE_DSA_PAGE_TOUCH
    FI_SHM_MAX_GDRCOPY_SIZE FI_SHM_RX_SIZE FI_SHM_SAR_THRESHOLD FI_SHM_TX_SIZE FI_SHM_USE_DSA_SAR FI_SHM_USE_XPMEM
    FI_SOCKETS_IFACE FI_TCP_DISABLE_AUTO_PROGRESS FI_TCP_FIREWALL_ADDR FI_TCP_IFACE FI_TCP_IO_URING
    FI_TCP_MAX_INJECT FI_TCP_MAX_RX_SIZE FI_TCP_MAX_SAVED FI_TCP_MAX_SAVED_SIZE FI_TCP_NODELAY
    FI_TCP_PORT_HIGH_RANGE FI_TCP_PORT_LOW_RANGE FI_TCP_PREFETCH_RBUF_SIZE FI_TCP_PROV_NAME FI_TCP_RX_SIZE
    FI_TCP_STAGING_SBUF_SIZE FI_TCP_TRACE_MSG FI_TCP_TX_SIZE FI_TCP_ZEROCOPY_SIZE FI_UNIVERSE_SIZE
    FI_VERBS_AFFINITY_DEVICE FI_VERBS_CQREAD_BUNCH_SIZE FI_VERBS_DEVICE_NAME FI_VERBS_DGRAM_NAME_SERVER_PORT
    FI_VERBS_DGRAM_USE_NAME_SERVER FI_VERBS_GID_IDX FI_VERBS_IFACE FI_VERBS_INLINE_SIZE FI_VERBS_MIN_RNR_TIMER
    FI_VERBS_NIC_AFFINITY_CONFIG FI_VERBS_NIC_AFFINITY_POLICY FI_VERBS_PREFER_XRC FI_VERBS_RX_IOV_LIMIT
    FI_VERBS_RX_SIZE FI_VERBS_TX_IOV_LIMIT FI_VERBS_TX_SIZE FI_VERBS_USE_DMABUF FI_VERBS_USE_ODP
    FI_VERBS_XRCD_FILENAME FI_XPMEM_MEMCPY_CHUNKSIZE
"""

# aws-ofi-nccl (OFI_NCCL_*), aws/aws-ofi-nccl @ 2daf7d303aa139a03140aa530957d10521e4478d, include/nccl_ofi_param.h:
# every OFI_NCCL_PARAM / OFI_NCCL_PARAM_DEPRECATED name, prefixed OFI_NCCL_ as src/nccl_ofi_param.cpp does, and
# OFI_NCCL_FORCE_PRODUCT_NAME and NCCL_GIN_PROXY_NTHREADS (src/, getenv). RDMAV_FORK_SAFE is rdma-core's: the plugin
# sets it (platform-aws.cpp) on libfabric < 1.13 and doc/efa-env-var.md warns against setting it by hand, but
# rdma-core reads it. The two OFI_NCCL_PARAM_REMOVED names are in REMOVED below (the plugin stops on them).
_AWS_OFI_NCCL = """
    OFI_NCCL_ABORT_ON_ERROR OFI_NCCL_CM_NUM_RX_BUFFERS OFI_NCCL_CQ_READ_COUNT OFI_NCCL_CQ_SIZE
    OFI_NCCL_CUDA_FLUSH_ENABLE OFI_NCCL_DISABLE_CLOSE_MESSAGE OFI_NCCL_DISABLE_DMABUF
    OFI_NCCL_DISABLE_GDR_REQUIRED_CHECK OFI_NCCL_DISABLE_NATIVE_RDMA_CHECK OFI_NCCL_EAGER_MAX_SIZE
    OFI_NCCL_EARLY_COMPLETION OFI_NCCL_ENDPOINT_PER_COMM OFI_NCCL_ERRORCHECK_MUTEX OFI_NCCL_EXCLUDE_TCP_IF
    OFI_NCCL_FORCE_NUM_RAILS OFI_NCCL_FORCE_PRODUCT_NAME OFI_NCCL_GDAKI_EFA_HW_COUNTER OFI_NCCL_GDR_FLUSH_DISABLE
    OFI_NCCL_GIN_CQ_PROCESS_MAX_ITER OFI_NCCL_MIN_STRIPE_SIZE OFI_NCCL_MR_CACHE_DISABLE OFI_NCCL_MR_KEY_SIZE
    OFI_NCCL_NET_LATENCY OFI_NCCL_NIC_DUP_CONNS OFI_NCCL_NVTX_TRACE_DIMENSION OFI_NCCL_PLATFORM
    OFI_NCCL_PROGRESS_MODEL OFI_NCCL_PROTOCOL OFI_NCCL_RDMA_MAX_POSTED_CONTROL_BUFFERS
    OFI_NCCL_RDMA_MAX_POSTED_EAGER_BUFFERS OFI_NCCL_RDMA_MIN_POSTED_CONTROL_BUFFERS
    OFI_NCCL_RDMA_MIN_POSTED_EAGER_BUFFERS OFI_NCCL_RR_CTRL_MSG OFI_NCCL_SCHED_MAX_SMALL_RR_SIZE
    OFI_NCCL_SKIP_NICS_WITHOUT_ACCEL_AT_SAME_PCI_LEVEL OFI_NCCL_TUNER_NET_COMP_OVERHEAD OFI_NCCL_TUNER_NET_LATENCY
    OFI_NCCL_TUNER_NUM_CHANNELS OFI_NCCL_TUNER_TYPE OFI_NCCL_USE_IPV6_TCP OFI_NCCL_USE_LOW_LATENCY_TC
    NCCL_GIN_PROXY_NTHREADS RDMAV_FORK_SAFE
"""

# GPUDirect-TCPX plugin (GCP A3 High), GoogleCloudPlatform/container-engine-accelerators:
# gpudirect-tcpx/nccl-config.yaml @ 992db81257553607f1477945f1b3219632991829 and gpudirect-tcpx/config-with-env.yaml
# @ 0713f2e50a71e19ae8f3847cc4bd81021637d2cc (the -x NAME=value lines of run-nccl.sh; the latter adds
# UNIX_CLIENT_PREFIX, FORCE_ACK and TX_COMPLETION_NANOSLEEP).
_GCP_TCPX = """
    NCCL_GPUDIRECTTCPX_SOCKET_IFNAME NCCL_GPUDIRECTTCPX_CTRL_DEV NCCL_GPUDIRECTTCPX_TX_BINDINGS
    NCCL_GPUDIRECTTCPX_RX_BINDINGS NCCL_GPUDIRECTTCPX_PROGRAM_FLOW_STEERING_WAIT_MICROS
    NCCL_GPUDIRECTTCPX_UNIX_CLIENT_PREFIX NCCL_GPUDIRECTTCPX_FORCE_ACK NCCL_GPUDIRECTTCPX_TX_COMPLETION_NANOSLEEP
    NCCL_DYNAMIC_CHUNK_SIZE
"""

# GPUDirect-TCPXO plugin (GCP A3 Mega): container-engine-accelerators @ 992db812..., gpudirect-tcpxo/README.md and
# nccl-test-latest.yaml (every NCCL_FASTRAK_*, the tuner and guest-config-checker names); NCCL_USE_SNAP from
# allenai/OLMo-core @ fa6c5014c9f6e9ee789da2d9c20d5126fee8df0d, src/olmo_core/distributed/utils.py (its A3 Mega
# "augusta" settings). NCCL_FASTRAK_FLOWS_PER_GROUP, NCCL_SHIMNET_SHIM_LAYERS (=UNUSED turns the guest config
# checker off) and NCCL_NET_PLUGIN_TELEMETRY_MODE appear in public TCPXO launch scripts that source GCP's
# nccl-env-profile.sh, not in a GCP repository we could read: kept so those scripts' settings go in.
_GCP_TCPXO = """
    NCCL_FASTRAK_CTRL_DEV NCCL_FASTRAK_IFNAME NCCL_FASTRAK_NUM_FLOWS NCCL_FASTRAK_ENABLE_CONTROL_CHANNEL
    NCCL_FASTRAK_USE_SNAP NCCL_FASTRAK_USE_LLCM NCCL_FASTRAK_LLCM_DEVICE_DIRECTORY NCCL_FASTRAK_ENABLE_HOTPATH_LOGGING
    NCCL_FASTRAK_PLUGIN_ACCEPT_TIMEOUT_MS NCCL_FASTRAK_DUMP_COMM_STATS NCCL_FASTRAK_DATA_TRANSFER_SLOWNESS_MS
    NCCL_TUNER_CONFIG_PATH NCCL_SHIMNET_GUEST_CONFIG_CHECKER_CONFIG_FILE NCCL_USE_SNAP
    NCCL_FASTRAK_FLOWS_PER_GROUP NCCL_SHIMNET_SHIM_LAYERS NCCL_NET_PLUGIN_TELEMETRY_MODE
"""

# UCX (UCX_*), openucx/ucx @ 9466d104a317c8ffddd9734e72055d8bbda021b3: the config tables of src/ucp/core/ucp_context.c
# (TLS, NET_DEVICES, RNDV_*, MAX_*_RAILS, UNIFIED_MODE, SOCKADDR_TLS_PRIORITY, ZCOPY_THRESH), src/ucs/config/
# global_opts.c (LOG_LEVEL, MEMTYPE_CACHE, WARN_UNUSED_ENV_VARS), src/uct/ib/base/ib_iface.c and ib_md.c with prefix
# IB_ (SL, TRAFFIC_CLASS, GID_INDEX, PCI_RELAXED_ORDERING; IB_REG_METHODS until UCX 1.15), src/uct/ib/rc/base/
# rc_iface.c with prefix RC_ (TIMEOUT, RETRY_COUNT), src/uct/sm/mm/posix/mm_posix.c with prefix POSIX_.
_UCX = """
    UCX_TLS UCX_NET_DEVICES UCX_IB_GID_INDEX UCX_IB_SL UCX_IB_TRAFFIC_CLASS UCX_IB_PCI_RELAXED_ORDERING
    UCX_IB_REG_METHODS UCX_LOG_LEVEL UCX_MEMTYPE_CACHE UCX_RNDV_THRESH UCX_RNDV_SCHEME UCX_MAX_RNDV_RAILS
    UCX_MAX_EAGER_RAILS UCX_RC_TIMEOUT UCX_RC_RETRY_COUNT UCX_UNIFIED_MODE UCX_WARN_UNUSED_ENV_VARS
    UCX_SOCKADDR_TLS_PRIORITY UCX_ZCOPY_THRESH UCX_POSIX_USE_PROC_LINK
"""

# SHARP (SHARP_COLL_*) and the NCCL-RDMA-SHARP plugin's own names: Mellanox/nccl-rdma-sharp-plugins
# @ 2f5ac02e164336044388b7f1f6242cc0db575fec, src/ (every NCCL_PARAM, prefixed NCCL_ as include/param.h does; every
# getenv/setenv) and .ci/ (the SHARP_COLL_* its CI passes to the SHARP library); SHARP_COLL_ENABLE_PCI_RELAXED_ORDERING,
# _ENABLE_MCAST_TARGET, _OSTS_PER_GROUP and _SAT_LOCK_BATCH_SIZE are SHARP library settings seen in public NCCL+SHARP
# launch scripts (the library is closed source).
_SHARP = """
    SHARP_COLL_ENABLE_SAT SHARP_COLL_LOG_LEVEL SHARP_COLL_LOCK_ON_COMM_INIT SHARP_COLL_ENABLE_MCAST
    SHARP_COLL_NUM_COLL_GROUP_RESOURCE_ALLOC_THRESHOLD SHARP_COLL_SAT_THRESHOLD SHARP_COLL_JOB_QUOTA_OSTS
    SHARP_COLL_JOB_QUOTA_MAX_GROUPS SHARP_COLL_JOB_QUOTA_PAYLOAD_PER_OST SHARP_COLL_GROUP_RESOURCE_POLICY
    SHARP_COLL_MAX_PAYLOAD_SIZE SHARP_COLL_PIPELINE_DEPTH SHARP_COLLNET_OVERLAP_AG
    SHARP_COLL_ENABLE_PCI_RELAXED_ORDERING SHARP_COLL_ENABLE_MCAST_TARGET SHARP_COLL_OSTS_PER_GROUP
    SHARP_COLL_SAT_LOCK_BATCH_SIZE NCCL_IBEXT_DISABLE NCCL_IB_IS_GLOBAL NCCL_PLUGIN_P2P NCCL_SHARP_DISABLE
    NCCL_SHARP_DISABLE_ALLGATHER NCCL_SHARP_DISABLE_REDUCE_SCATTER NCCL_SHARP_GROUP_SIZE_THRESH NCCL_SHARP_MAX_COMMS
    NCCL_SHARP_V3_DATATYPES NCCL_SHARP_COLL_TRACE NCCL_UCX_CUDA_DISABLE NCCL_UCX_DISABLE NCCL_UCX_RMA_DISABLE
    NCCL_UCX_TLS NCCL_UCX_ZCOPY_THRESH
"""

# Names a component stops on or that its current release removed, with the replacement (checked before "unknown").
REMOVED = {
    "OFI_NCCL_RDMA_MIN_POSTED_BOUNCE_BUFFERS": (
        "aws-ofi-nccl", "OFI_NCCL_RDMA_MIN_POSTED_CONTROL_BUFFERS and OFI_NCCL_RDMA_MIN_POSTED_EAGER_BUFFERS"),
    "OFI_NCCL_RDMA_MAX_POSTED_BOUNCE_BUFFERS": (
        "aws-ofi-nccl", "OFI_NCCL_RDMA_MAX_POSTED_CONTROL_BUFFERS and OFI_NCCL_RDMA_MAX_POSTED_EAGER_BUFFERS"),
}

# Components and their names, for messages ("read by ...").
COMPONENTS = {
    "libfabric": frozenset(_LIBFABRIC.split()),
    "aws-ofi-nccl": frozenset(_AWS_OFI_NCCL.split()),
    "the GPUDirect-TCPX NCCL plugin": frozenset(_GCP_TCPX.split()),
    "the GPUDirect-TCPXO NCCL plugin": frozenset(_GCP_TCPXO.split()),
    "UCX": frozenset(_UCX.split()),
    "SHARP or the NCCL-RDMA-SHARP plugin": frozenset(_SHARP.split()),
}

KNOWN_NCCL = frozenset(_NCCL.split())
KNOWN_TORCH = frozenset(_TORCH.split())
KNOWN_OTHER = frozenset(_GLOO_CUDA_OMP.split()) | frozenset(_OTHER.split())
KNOWN_FABRIC = frozenset().union(*COMPONENTS.values())
KNOWN = KNOWN_NCCL | KNOWN_TORCH | KNOWN_OTHER | KNOWN_FABRIC

# Derived from the cluster model: a user sets cluster_* instead, never these directly.
RESERVED = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "NNODES", "NPROC_PER_NODE", "NODE_RANK")
# Lines that legitimately differ between nodes.
PER_NODE = ("NODE_RANK",)

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# The env file is read by three consumers: `docker run --env-file` (the rest of the line after the first "=",
# literally: no quote removal, no escapes, trailing blanks kept), systemd's EnvironmentFile= (systemd.exec(5):
# leading/trailing blanks dropped, a value starting with ' or " is unquoted, a backslash escapes the next
# character, quotes after the first character are kept) and the launch module (module_utils/torchrun.py,
# parse_env_file). They agree exactly on a value that has no line break, NUL or backslash, no blank at either
# end and does not start with a quote: such a value is written as it is (";", ",", ":", "=", "#", "$", inner
# quotes and inner blanks included); any other value is refused, saying why.
_VALUE_PROBLEMS = (
    (lambda t: "\n" in t or "\r" in t, "has a line break (one line per variable in every env file format)"),
    (lambda t: "\0" in t, "has a NUL character (no environment can hold it)"),
    (lambda t: "\\" in t, "has a backslash: systemd's EnvironmentFile= reads it as an escape, docker --env-file "
                          "keeps it"),
    (lambda t: t[:1] in ("'", '"'), "starts with a quote: systemd's EnvironmentFile= removes the quotes, "
                                    "docker --env-file keeps them (write the value without the surrounding quotes)"),
    (lambda t: t != t.strip(" \t"), "has a blank at the start or end: systemd drops it, docker --env-file keeps it"),
)


def suggest(name: str, known=KNOWN) -> str | None:
    """The known variable nearest to `name` (plugin_utils/did_you_mean.py), or None when nothing is close."""
    return nearest(name, known)


def is_allowed(name: str, allow=()) -> bool:
    """True when `name` is known, or matches one of the user's names/patterns in `allow`."""
    return name in KNOWN or any(fnmatch.fnmatchcase(name, pattern) for pattern in allow or ())


def to_value(value) -> str:
    """An env-file value: booleans as 1/0, numbers and strings as text; None is an error."""
    if value is None:
        raise ValueError("has no value (null)")
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, (int, float, str)):
        return str(value)
    raise ValueError(f"must be a string, number or boolean, not {type(value).__name__}")


def check_name(name: str, allow=()) -> str | None:
    """Why `name` cannot be an env-file variable, or None when it can."""
    if not isinstance(name, str) or not _NAME.match(name):
        return f"{name!r} is not a valid variable name (letters, digits, underscore; not starting with a digit)"
    if name in REMOVED and not any(fnmatch.fnmatchcase(name, pattern) for pattern in allow or ()):
        component, instead = REMOVED[name]
        return f"{name} was removed from {component}, which stops on it; use {instead} instead"
    if is_allowed(name, allow):
        return None
    near = suggest(name)
    hint = f"; did you mean {near}?" if near else ""
    return (f"{name} is not a variable NCCL, its network and tuner plugins (aws-ofi-nccl, GPUDirect-TCPX/TCPXO), "
            f"libfabric, UCX, SHARP, torch or the launcher reads{hint} "
            f"(a variable of your own: add it to nccl_env_allow_unknown)")


def check_value(name: str, value) -> tuple[str | None, str | None]:
    """(value as text, None) or (None, why no env-file consumer can carry it the same way)."""
    try:
        text = to_value(value)
    except ValueError as exc:
        return None, f"{name} {exc}"
    for bad, why in _VALUE_PROBLEMS:
        if bad(text):
            return None, f"{name}={text!r}: the value {why}"
    return text, None


# Profiles on the verbs transport: turning InfiniBand off there moves the job onto sockets without a word.
VERBS_PROFILES = ("ib", "roce")

# What configures an RDMA fabric for NCCL, by name: the verbs transport (NCCL_IB_*, the older IB plugin's
# NCCL_IBEXT_*, SHARP), UCX and libfabric (EFA), GCP's GPUDirect transports, the net plugin and GPUDirect RDMA.
# The tcp profile writes NCCL_IB_DISABLE=1, which turns all of it off: such settings beside it are an RDMA
# environment about to run on sockets (e.g. GCP's gIB settings: NCCL_NET=gIB, NCCL_IB_TC, NCCL_IB_FIFO_TC in
# GoogleCloudPlatform's gpudirect-gib images; an InfiniBand site's NCCL_IB_HCA, NCCL_IB_GID_INDEX, UCX_NET_DEVICES).
RDMA_PREFIXES = ("NCCL_IB_", "NCCL_IBEXT_", "NCCL_SHARP_", "SHARP_COLL_", "UCX_", "FI_", "NCCL_GPUDIRECTTCPX_",
                 "NCCL_FASTRAK_", "NCCL_GIB_")
RDMA_NAMES = ("NCCL_NET", "NCCL_NET_PLUGIN", "NCCL_COLLNET_ENABLE", "NCCL_NET_GDR_LEVEL", "NCCL_NET_GDR_READ",
              "NCCL_GDR_FLUSH_DISABLE", "NCCL_DMABUF_ENABLE")
_ROCE_HINTS = ("NCCL_IB_GID_INDEX", "NCCL_IB_TC", "NCCL_IB_FIFO_TC", "NCCL_IB_ROCE_VERSION_NUM")


def _on(value) -> bool:
    return str(value).strip().lower() in ("1", "true", "yes", "on")


def rdma_settings(env) -> tuple[list[str], str]:
    """(the names in env that configure an RDMA fabric, the nccl_env_profile that keeps it): ([], "") when there
    are none, when env is not a mapping, or when env itself turns InfiniBand off (NCCL_IB_DISABLE=1: the user
    chose sockets and said so). NCCL_NET=Socket is the socket transport, not a fabric."""
    if not isinstance(env, dict) or _on(env.get("NCCL_IB_DISABLE", "0")):
        return [], ""
    names = sorted(str(n) for n, v in env.items()
                   if (str(n).startswith(RDMA_PREFIXES) or str(n) in RDMA_NAMES)
                   and not (str(n) == "NCCL_NET" and str(v).strip().lower() == "socket"))
    if not names:
        return [], ""
    net = " ".join(str(env.get(n, "")) for n in ("NCCL_NET", "NCCL_NET_PLUGIN")).lower()
    if any(n.startswith("FI_") for n in names) or "ofi" in net or "libfabric" in net:
        profile = "efa"
    elif any(n.startswith("NCCL_GPUDIRECTTCPX_") for n in names):
        profile = "gcp-tcpx"
    elif any(n.startswith("NCCL_FASTRAK_") for n in names):
        profile = "gcp-tcpxo"
    elif "gib" in net or any(n in _ROCE_HINTS for n in names):
        profile = "roce"
    else:
        profile = "ib"
    return names, profile


def _int(value) -> int:
    """A setting as a number, 0 when it is none (as Jinja's int filter reads it)."""
    try:
        return int(str(value).strip())
    except ValueError:
        try:
            return int(float(str(value).strip()))
        except ValueError:
            return 0


def _given(value):
    """value, or None (the line left out) when it is empty."""
    return value if len(str(value if value is not None else "")) > 0 else None


def job_devices(visible_devices) -> dict:
    """The lines that give the node's job its GPUs: CUDA_DEVICE_ORDER (PCI bus order, nvidia-smi's) and
    CUDA_VISIBLE_DEVICES, the nvidia_driver role's nvidia_driver_visible_devices (GPU indexes in PCI order or UUIDs,
    comma-separated; empty: every GPU, and None leaves the line out). nccl.env's "devices and processes" section, which
    the sweep and the launch read, and the GPU stress of the prepare play (run before nccl.env is rendered) take them
    from here, so both give the job's GPUs the same way."""
    return {"CUDA_DEVICE_ORDER": "PCI_BUS_ID",
            "CUDA_VISIBLE_DEVICES": _given(visible_devices if visible_devices is not None else "")}


def _profile_vars(s: dict, ifname: str) -> dict:
    """The transport lines of profile s["profile"] ({} for an unknown one). ib and roce never write NCCL_IB_DISABLE
    (NCCL's default uses the HCAs) and leave the HCAs to NCCL unless nccl_env_ib_hca names them. The GCP values are
    GCP's documented settings (GoogleCloudPlatform/container-engine-accelerators gpudirect-tcpx/nccl-config.yaml;
    GCP's nccl-env-profile.sh for TCPXO). EFA: FI_PROVIDER=efa as AWS's own launch scripts set it
    (aws-samples/awsome-distributed-training); not FI_EFA_USE_DEVICE_RDMA, which aws-ofi-nccl's doc/efa-env-var.md
    says not to set with libfabric >= 1.18 and aws-ofi-nccl >= 1.7 (libfabric aborts the job when it is set on an EFA
    device without RDMA read: prov/efa/src/rdm/efa_rdm_util.c); a user who needs it puts it in nccl_env_extra."""
    profile, nics, plugin_dir = s.get("profile"), s.get("gpu_nics", ""), s.get("plugin_dir", "")
    if profile == "tcp":
        return {"NCCL_IB_DISABLE": 1,
                "NCCL_NSOCKS_PERTHREAD": s.get("nsocks_perthread") if _int(s.get("nsocks_perthread")) > 0 else None,
                "NCCL_SOCKET_NTHREADS": s.get("socket_nthreads") if _int(s.get("socket_nthreads")) > 0 else None}
    if profile in ("ib", "roce"):
        return {"NCCL_IB_HCA": _given(s.get("ib_hca", "")), "NCCL_IB_GID_INDEX": _given(s.get("ib_gid_index", ""))}
    if profile == "efa":
        return {"FI_PROVIDER": "efa"}
    if profile == "gcp-tcpx":
        return {"NCCL_CROSS_NIC": 0, "NCCL_ALGO": "Ring,Tree", "NCCL_PROTO": "Simple", "NCCL_NET_GDR_LEVEL": "PIX",
                "NCCL_P2P_PXN_LEVEL": 0, "NCCL_GPUDIRECTTCPX_SOCKET_IFNAME": nics,
                "NCCL_GPUDIRECTTCPX_CTRL_DEV": ifname, "NCCL_DYNAMIC_CHUNK_SIZE": 524288,
                "NCCL_P2P_NET_CHUNKSIZE": 524288, "NCCL_P2P_PCI_CHUNKSIZE": 524288, "NCCL_P2P_NVL_CHUNKSIZE": 1048576,
                "NCCL_BUFFSIZE": 4194304, "NCCL_NSOCKS_PERTHREAD": 4, "NCCL_SOCKET_NTHREADS": 1,
                "NCCL_GPUDIRECTTCPX_TX_BINDINGS": _given(s.get("tcpx_tx_bindings", "")),
                "NCCL_GPUDIRECTTCPX_RX_BINDINGS": _given(s.get("tcpx_rx_bindings", "")),
                "NCCL_GPUDIRECTTCPX_PROGRAM_FLOW_STEERING_WAIT_MICROS": 500000}
    if profile == "gcp-tcpxo":
        return {"NCCL_FASTRAK_CTRL_DEV": ifname, "NCCL_FASTRAK_IFNAME": nics, "NCCL_CROSS_NIC": 0,
                "NCCL_ALGO": "Ring,Tree", "NCCL_PROTO": "Simple", "NCCL_MIN_NCHANNELS": 4,
                "NCCL_P2P_NET_CHUNKSIZE": 524288, "NCCL_P2P_PCI_CHUNKSIZE": 524288, "NCCL_P2P_NVL_CHUNKSIZE": 1048576,
                "NCCL_FASTRAK_NUM_FLOWS": 2, "NCCL_FASTRAK_ENABLE_CONTROL_CHANNEL": 0, "NCCL_BUFFSIZE": 8388608,
                "NCCL_FASTRAK_USE_SNAP": 1, "NCCL_FASTRAK_USE_LLCM": 1, "NCCL_NET_GDR_LEVEL": "PIX",
                "NCCL_FASTRAK_ENABLE_HOTPATH_LOGGING": 0, "NCCL_TUNER_PLUGIN": "libnccl-tuner.so",
                "NCCL_TUNER_CONFIG_PATH": f"{plugin_dir}/a3plus_tuner_config.textproto",
                "NCCL_SHIMNET_GUEST_CONFIG_CHECKER_CONFIG_FILE": f"{plugin_dir}/a3plus_guest_config.textproto",
                "NCCL_FASTRAK_PLUGIN_ACCEPT_TIMEOUT_MS": 600000, "NCCL_NVLS_ENABLE": 0}
    return {}


def role_sections(model: dict, ifname: str, s: dict) -> list[dict]:
    """The role's sections of the env file, [{title, vars}] in file order (a None value leaves the line out), from
    the cluster model, the data interface and the role's settings s (the nccl_env_* variables without the prefix;
    gpu_nics, plugin_dir as resolved by the role, visible_devices: nvidia_driver_visible_devices).

    NCCL_DEBUG auto: the file says WARN, and the launch module gives INFO (with NCCL_DEBUG_SUBSYS) to a node's first
    launch of the job only (nccl_env_first_launch_env): the first start logs NCCL's transport and interface choices,
    and the file never changes between runs because of a launch (a converged re-run stays changed=0)."""
    level = "WARN" if s.get("debug") == "auto" else s.get("debug")
    transport = _profile_vars(s, ifname)
    if s.get("p2p_disable"):
        transport["NCCL_P2P_DISABLE"] = 1
    if s.get("shm_disable"):
        transport["NCCL_SHM_DISABLE"] = 1
    entries, rw = s.get("flight_recorder_entries"), s.get("rw_dir", "")
    subsys = s.get("debug_subsys", "")
    return [
        {"title": "rendezvous (from the cluster model)",
         "vars": {"MASTER_ADDR": model.get("master_addr"), "MASTER_PORT": model.get("master_port"),
                  "NNODES": model.get("nnodes"), "NPROC_PER_NODE": model.get("nproc_per_node"),
                  "WORLD_SIZE": model.get("world_size"), "NODE_RANK": model.get("node_rank")}},
        {"title": "data interface", "vars": {"NCCL_SOCKET_IFNAME": ifname, "GLOO_SOCKET_IFNAME": ifname}},
        {"title": f"NCCL transport (profile {s.get('profile')})", "vars": transport},
        {"title": "errors, timeouts and debugging",
         "vars": {"TORCH_NCCL_ASYNC_ERROR_HANDLING": s.get("async_error_handling"),
                  "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC": s.get("heartbeat_timeout_s"),
                  "TRAINYARD_COLLECTIVE_TIMEOUT_S": s.get("collective_timeout_s"),
                  "DEEPSPEED_TIMEOUT": (_int(s.get("collective_timeout_s")) + 59) // 60,
                  "NCCL_DEBUG": level,
                  "NCCL_DEBUG_SUBSYS": subsys if level in ("INFO", "TRACE") and len(subsys) > 0 else None,
                  "TORCH_DISTRIBUTED_DEBUG": _given(s.get("distributed_debug", ""))}},
        # CUDA_VISIBLE_DEVICES: the node's GPUs for the job, the same list the report's local-rank map shows
        # (nvidia_driver role).
        {"title": "devices and processes",
         "vars": dict(job_devices(s.get("visible_devices", "")), OMP_NUM_THREADS=s.get("omp_num_threads"),
                      PYTORCH_CUDA_ALLOC_CONF=_given(s.get("cuda_alloc_conf", "")))},
        {"title": "hang diagnosis (PyTorch's NCCL flight recorder, dumped on a collective timeout; per-rank progress "
                  "files)",
         "vars": {} if _int(entries) <= 0 else {
             "TORCH_FR_BUFFER_SIZE": entries, "TORCH_NCCL_TRACE_BUFFER_SIZE": entries,
             "TORCH_NCCL_DUMP_ON_TIMEOUT": 1, "TORCH_NCCL_ENABLE_MONITORING": 1,
             "TORCH_FR_DUMP_TEMP_FILE": f"{rw}/flight_recorder/rank_",
             "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": f"{rw}/flight_recorder/rank_",
             "TORCH_NCCL_DEBUG_INFO_PIPE_FILE": f"{rw}/flight_recorder/pipe_",
             "TRAINYARD_PROGRESS_DIR": f"{rw}/progress"}},
    ]


def build_env(sections, extra=None, allow=(), profile=""):
    """Merge the role's sections with the user's extras and check every name and value.

    sections: list of {"title": str, "vars": {name: value}} in file order; a value of None drops the line
    (an option the role leaves unset). extra: the user's {name: value}; it may override a role variable (the line
    moves to the extras section) but not one of RESERVED. Returns (sections, env, errors): sections with text
    values and the user's section last, the flat env, and one message per bad name or value.
    """
    errors: list[str] = []
    extra = dict(extra or {})
    for name in extra:
        if name in RESERVED:
            errors.append(f"{name} comes from the cluster model and cannot be set in nccl_env_extra "
                          f"(set the matching cluster_* variable instead)")
    if profile in VERBS_PROFILES and str(extra.get("NCCL_IB_DISABLE", "0")).strip().lower() in ("1", "true", "yes"):
        errors.append(f"NCCL_IB_DISABLE={extra['NCCL_IB_DISABLE']} in nccl_env_extra turns InfiniBand off under "
                      f"nccl_env_profile {profile}: NCCL would fall back to TCP sockets on this fabric; remove it "
                      f"(a job meant to run over sockets says so with nccl_env_profile: tcp)")
    out: list[dict] = []
    env: dict[str, str] = {}
    for section in list(sections or []) + [{"title": "user variables (nccl_env_extra)", "vars": extra}]:
        is_extra = section["vars"] is extra
        lines: dict[str, str] = {}
        for name, value in (section.get("vars") or {}).items():
            if not is_extra and (name in extra and name not in RESERVED):
                continue
            if value is None or (not is_extra and value == ""):
                continue
            why = check_name(name, allow)
            if why:
                errors.append(why)
                continue
            text, why = check_value(name, value)
            if why:
                errors.append(why)
                continue
            if name in env and not is_extra:
                errors.append(f"{name} is set twice by the role (sections overlap)")
            lines[name] = text
            env[name] = text
        if lines:
            out.append({"title": section.get("title", ""), "vars": lines})
    return out, env, errors


def parse_env(text: str) -> tuple[dict[str, str], list[str]]:
    """KEY=VALUE lines → ({key: value}, [lines that are neither blank, comment nor KEY=VALUE])."""
    env: dict[str, str] = {}
    bad: list[str] = []
    for raw in (text or "").splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("export "):
            line = line[len("export "):].lstrip()
        key, sep, value = line.partition("=")
        if not sep or not _NAME.match(key):
            bad.append(raw)
            continue
        env[key] = value
    return env, bad


def normalise(text: str, per_node=PER_NODE) -> list[str]:
    """The lines that must agree across nodes: sorted KEY=VALUE without the per-node keys, comments and blanks;
    unparseable lines are kept (as `?? line`) so they count as a difference."""
    env, bad = parse_env(text)
    lines = [f"{k}={v}" for k, v in sorted(env.items()) if k not in per_node]
    return lines + [f"?? {b}" for b in bad]


def digest(lines: list[str]) -> str:
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()


def consistency(files, per_node=PER_NODE, expected=None) -> dict[str, dict]:
    """Compare every node's env file with the majority.

    files: {host: file text, or None when the node has no file}, in rank order (ties between groups of the same
    size go to the group of the lowest rank). expected: optional {host: {key: value}}; the per-node keys of each
    host's file are compared with it (they are left out of the cross-node comparison). Returns {host: {consistent,
    missing, digest, reference, reference_hosts, diff}}; diff is a unified diff of the normalised lines, majority
    first ("-" lines: what the majority has, "+" lines: what this node has).
    """
    expected = expected or {}
    norm = {h: (normalise(t, per_node) if t is not None else None) for h, t in files.items()}
    digests = {h: (digest(n) if n is not None else "missing") for h, n in norm.items()}
    present = [d for d in digests.values() if d != "missing"]
    counts = Counter(present)
    first = {}
    for i, d in enumerate(present):
        first.setdefault(d, i)
    ref = min(counts, key=lambda d: (-counts[d], first[d])) if counts else "missing"
    ref_hosts = [h for h, d in digests.items() if d == ref]
    ref_lines = norm[ref_hosts[0]] if ref_hosts and norm[ref_hosts[0]] is not None else []
    result: dict[str, dict] = {}
    for host, lines in norm.items():
        missing = lines is None
        same = not missing and digests[host] == ref
        diff: list[str] = []
        if missing:
            diff.append("(no env file on this node)")
        elif not same:
            diff.extend(difflib.unified_diff(ref_lines, lines, fromfile=f"majority ({', '.join(ref_hosts)})",
                                             tofile=host, lineterm="", n=0))
        if not missing and expected.get(host):
            env, _ = parse_env(files[host])
            for key in per_node:
                want = expected[host].get(key)
                if want is not None and env.get(key) != str(want):
                    same = False
                    diff.append(f"{key}={env.get(key, '(absent)')} on this node, expected {key}={want}")
        result[host] = {"consistent": same, "missing": missing, "digest": digests[host], "reference": ref,
                        "reference_hosts": ref_hosts, "diff": "\n".join(diff)}
    return result
