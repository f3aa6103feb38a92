# -*- coding: utf-8 -*-
"""The environment variables NCCL, torch and their neighbours read, and the pure helpers of role nccl_env.

Used on the controller by action_plugins/nccl_env_validate.py (names and values, before anything is written) and
filter_plugins/render.py (the across-nodes consistency check). Stdlib only; unit-tested in
tests/unit/test_nccl_env*.py.

Where the names come from: every NUL-terminated NCCL_*/TORCH_*/PYTORCH_*/TORCHELASTIC_*/GLOO_*/CUDA_*/OMP_*
string in the shared libraries of torch 2.11.0+cu130 and NCCL 2.28 (libnccl.so.2, libtorch_cpu/cuda/python.so,
libc10*.so, libgomp) and every such quoted name in torch's Python sources, captured on the H100/H200 machines,
minus C macro and enum names (CUDA_ERROR_*, TORCH_CHECK, NCCL_LOG_*, ...); plus names older NCCL and torch
releases still document (NCCL_ASYNC_ERROR_HANDLING, NCCL_LL_THRESHOLD, ...), the rendezvous and launcher names
torchrun and DeepSpeed read, and the usual Hugging Face / logging names. A name outside these lists is allowed
only through nccl_env_allow_unknown (names or shell-style patterns such as MYLAB_*).
"""

from __future__ import annotations

import difflib
import fnmatch
import hashlib
import re
from collections import Counter

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
    HF_HUB_DISABLE_TELEMETRY HF_HUB_DISABLE_PROGRESS_BARS TRANSFORMERS_CACHE TRANSFORMERS_OFFLINE
    TRANSFORMERS_VERBOSITY TOKENIZERS_PARALLELISM ACCELERATE_LOG_LEVEL TENSORBOARD_LOGGING_DIR
    WANDB_MODE WANDB_DISABLED WANDB_PROJECT WANDB_DIR WANDB_SILENT
    PYTHONUNBUFFERED PYTHONFAULTHANDLER PYTHONHASHSEED PYTHONPATH PYTHONDONTWRITEBYTECODE LOGLEVEL
    TRAINYARD_COLLECTIVE_TIMEOUT_S TRAINYARD_RESUME_FROM TRAINYARD_PROGRESS_DIR
"""

KNOWN_NCCL = frozenset(_NCCL.split())
KNOWN_TORCH = frozenset(_TORCH.split())
KNOWN_OTHER = frozenset(_GLOO_CUDA_OMP.split()) | frozenset(_OTHER.split())
KNOWN = KNOWN_NCCL | KNOWN_TORCH | KNOWN_OTHER

# Derived from the cluster model: a user sets cluster_* instead, never these directly.
RESERVED = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "NNODES", "NPROC_PER_NODE", "NODE_RANK")
# Lines that legitimately differ between nodes.
PER_NODE = ("NODE_RANK",)
IFACE_KEYS = ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME")

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# A value both `docker run --env-file` (takes the rest of the line literally) and a shell `set -a; . file`
# (interprets quotes, $, spaces, globs) read the same way: no quoting needed, so none allowed.
_SAFE_VALUE = re.compile(r"^[A-Za-z0-9_.,:/@%+=^-]*$")


def suggest(name: str, known=KNOWN) -> str | None:
    """The known name nearest to `name` (difflib), or None when nothing is close."""
    upper = name.upper()
    if upper != name and upper in known:
        return upper
    match = difflib.get_close_matches(upper, sorted(known), n=1, cutoff=0.6)
    return match[0] if match else None


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
    if is_allowed(name, allow):
        return None
    near = suggest(name)
    hint = f"; did you mean {near}?" if near else ""
    return (f"{name} is not a variable NCCL, torch or the launcher reads{hint} "
            f"(a variable of your own: add it to nccl_env_allow_unknown)")


def check_value(name: str, value) -> tuple[str | None, str | None]:
    """(value as text, None) or (None, why it cannot be written)."""
    try:
        text = to_value(value)
    except ValueError as exc:
        return None, f"{name} {exc}"
    if not _SAFE_VALUE.match(text):
        return None, (f"{name}={text!r}: the value has characters an env file cannot carry unquoted for both "
                      f"docker --env-file and a shell (allowed: letters, digits and _ . , : / @ % + = ^ -)")
    return text, None


def build_env(sections, extra=None, allow=()):
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
