"""ggml enums carried in rpc_tensor.op and op_params (spec appendix B); identical in v7 and v8."""

from __future__ import annotations

import enum


class Op(enum.IntEnum):
    NONE = 0
    DUP = 1
    ADD = 2
    ADD_ID = 3
    ADD1 = 4
    ACC = 5
    SUB = 6
    MUL = 7
    DIV = 8
    SQR = 9
    SQRT = 10
    LOG = 11
    SIN = 12
    COS = 13
    SUM = 14
    SUM_ROWS = 15
    CUMSUM = 16
    MEAN = 17
    ARGMAX = 18
    COUNT_EQUAL = 19
    REPEAT = 20
    REPEAT_BACK = 21
    CONCAT = 22
    SILU_BACK = 23
    NORM = 24
    RMS_NORM = 25
    RMS_NORM_BACK = 26
    GROUP_NORM = 27
    L2_NORM = 28
    MUL_MAT = 29
    MUL_MAT_ID = 30
    OUT_PROD = 31
    SCALE = 32
    SET = 33
    CPY = 34
    CONT = 35
    RESHAPE = 36
    VIEW = 37
    PERMUTE = 38
    TRANSPOSE = 39
    GET_ROWS = 40
    GET_ROWS_BACK = 41
    SET_ROWS = 42
    DIAG = 43
    DIAG_MASK_INF = 44
    DIAG_MASK_ZERO = 45
    SOFT_MAX = 46
    SOFT_MAX_BACK = 47
    ROPE = 48
    ROPE_BACK = 49
    CLAMP = 50
    CONV_TRANSPOSE_1D = 51
    IM2COL = 52
    IM2COL_BACK = 53
    IM2COL_3D = 54
    COL2IM_1D = 55
    CONV_2D = 56
    CONV_3D = 57
    CONV_2D_DW = 58
    CONV_TRANSPOSE_2D = 59
    POOL_1D = 60
    POOL_2D = 61
    POOL_2D_BACK = 62
    UPSCALE = 63
    PAD = 64
    PAD_REFLECT_1D = 65
    ROLL = 66
    ARANGE = 67
    TIMESTEP_EMBEDDING = 68
    ARGSORT = 69
    TOP_K = 70
    LEAKY_RELU = 71
    TRI = 72
    FILL = 73
    FLASH_ATTN_EXT = 74
    FLASH_ATTN_BACK = 75
    SSM_CONV = 76
    SSM_SCAN = 77
    WIN_PART = 78
    WIN_UNPART = 79
    GET_REL_POS = 80
    ADD_REL_POS = 81
    RWKV_WKV6 = 82
    GATED_LINEAR_ATTN = 83
    RWKV_WKV7 = 84
    SOLVE_TRI = 85
    GATED_DELTA_NET = 86
    LIGHTNING_INDEXER = 87
    DSV4_HC_COMB = 88
    DSV4_HC_PRE = 89
    DSV4_HC_POST = 90
    UNARY = 91
    MAP_CUSTOM1 = 92
    MAP_CUSTOM2 = 93
    MAP_CUSTOM3 = 94
    CUSTOM = 95
    CROSS_ENTROPY_LOSS = 96
    CROSS_ENTROPY_LOSS_BACK = 97
    OPT_STEP_ADAMW = 98
    OPT_STEP_SGD = 99
    GLU = 100


class Unary(enum.IntEnum):
    ABS = 0
    SGN = 1
    NEG = 2
    STEP = 3
    TANH = 4
    ELU = 5
    RELU = 6
    SIGMOID = 7
    GELU = 8
    GELU_QUICK = 9
    SILU = 10
    HARDSWISH = 11
    HARDSIGMOID = 12
    EXP = 13
    EXPM1 = 14
    SOFTPLUS = 15
    GELU_ERF = 16
    XIELU = 17
    FLOOR = 18
    CEIL = 19
    ROUND = 20
    TRUNC = 21


class Glu(enum.IntEnum):
    REGLU = 0
    GEGLU = 1
    SWIGLU = 2
    SWIGLU_OAI = 3
    GEGLU_ERF = 4
    GEGLU_QUICK = 5
    SWIGLU_CLAMP = 6


# Ops that only reinterpret memory the client already laid out: nothing to compute.
VIEW_OPS = frozenset({Op.NONE, Op.RESHAPE, Op.VIEW, Op.PERMUTE, Op.TRANSPOSE})


def op_name(op: int) -> str:
    try:
        return Op(op).name
    except ValueError:
        return f"OP{op}"
