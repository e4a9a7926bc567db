//! TensorFlow 1's reference variables, kernel by kernel: `VariableV2` and the ops that read or
//! update a variable through its `Ref(T)` edge (`Assign`, `AssignAdd`/`Sub`, `Scatter*`,
//! `CountUpTo`, `IsVariableInitialized`, `RefIdentity`, temporary variables), and every dense
//! optimizer rule in both forms (`ApplyX` on references, `ResourceApplyX` on handles), each
//! checked against TensorFlow's own numbers.
//!
//! The executor hands a kernel the reference tensor of each `Ref(T)` input; these tests build
//! those references themselves (`Tensor::reference`), as the executor would from `VariableV2`.

use std::sync::Arc;

use crate::kernels_support::*;
use tessera::device::DeviceType;
use tessera::error::Code;
use tessera::graph::registry;
use tessera::graph::{Graph, NodeSpec};
use tessera::kernels::{create_kernel, OpContext};
use tessera::proto::NodeDef;
use tessera::runtime::resource::ResourceMgr;
use tessera::tensor::{DType, PartialShape, ResourceHandle, Shape, Tensor, Var};

// ---------------------------------------------------------------------------------------------
// Golden numbers: TensorFlow 2.21's CPU kernels, float64, printed by tests/kernels_ref_golden.py
// (`tf.raw_ops.Apply*` on `tf.compat.v1.Variable(use_resource=False)` in a v1 graph). Every
// case starts from var = VAR0 and applies GRADS[0], GRADS[1], GRADS[2] with the
// hyper-parameters of its row in `cases()`.
// ---------------------------------------------------------------------------------------------

const VAR0: [f64; 3] = [1.0, -2.0, 0.5];
const GRADS: [[f64; 3]; 3] = [[0.5, -1.5, 2.0], [-0.25, 0.75, 0.0], [1.0, 1.0, -3.0]];

/// gradient_descent: ApplyGradientDescent (var, then the slots, after steps 1, 2, 3).
const GRADIENT_DESCENT: [[[f64; 3]; 1]; 3] = [
    [[0.95, -1.85, 0.3]],
    [[0.975, -1.925, 0.3]],
    [[0.875, -2.025, 0.6000000000000001]],
];
/// proximal_gradient_descent: ApplyProximalGradientDescent (var, then the slots, after steps 1, 2, 3).
const PROXIMAL_GRADIENT_DESCENT: [[[f64; 3]; 1]; 3] = [
    [[0.926470588235294, -1.808823529411765, 0.2892156862745098]],
    [[0.9279123414071511, -1.8419838523644754, 0.27864282968089193]],
    [[0.8067768053011285, -1.899003776827917, 0.562394931059698]],
];
/// proximal_gradient_descent_no_l1: ApplyProximalGradientDescent (var, then the slots, after steps 1, 2, 3).
const PROXIMAL_GRADIENT_DESCENT_NO_L1: [[[f64; 3]; 1]; 3] = [
    [[0.9313725490196078, -1.8137254901960784, 0.29411764705882354]],
    [[0.9376201460976546, -1.8516916570549788, 0.28835063437139563]],
    [[0.8211962216643673, -1.9134231931911558, 0.5768143474229369]],
];
/// adagrad: ApplyAdagrad (var, then the slots, after steps 1, 2, 3).
const ADAGRAD: [[[f64; 3]; 2]; 3] = [
    [
        [0.9154845745271484, -1.904168515250009, 0.40355143556591755],
        [0.35, 2.45, 4.3],
    ],
    [
        [0.9544095217352245, -1.9473798553936847, 0.40355143556591755],
        [0.4125, 3.0125, 4.3],
    ],
    [
        [0.8702688893528903, -1.9973019130236165, 0.4858127101319798],
        [1.4125, 4.0125, 13.3],
    ],
];
/// adagrad_frozen_slots: ApplyAdagrad (var, then the slots, after steps 1, 2, 3).
const ADAGRAD_FROZEN_SLOTS: [[[f64; 3]; 2]; 3] = [
    [
        [0.841886116991581, -1.6645898033750315, 0.13485162832988923],
        [0.1, 0.2, 0.3],
    ],
    [
        [0.9209430584957905, -1.8322949016875159, 0.13485162832988923],
        [0.1, 0.2, 0.3],
    ],
    [
        [0.6047152924789525, -2.055901699437495, 0.6825741858350554],
        [0.1, 0.2, 0.3],
    ],
];
/// adagrad_v2: ApplyAdagradV2 (var, then the slots, after steps 1, 2, 3).
const ADAGRAD_V2: [[[f64; 3]; 2]; 3] = [
    [
        [0.9168894000700255, -1.9047768734897432, 0.4040143196198622],
        [0.35, 2.45, 4.3],
    ],
    [
        [0.9552175783516245, -1.9477406771621717, 0.4040143196198622],
        [0.4125, 3.0125, 4.3],
    ],
    [
        [0.8717790034153124, -1.9974147515914662, 0.48605064709064233],
        [1.4125, 4.0125, 13.3],
    ],
];
/// proximal_adagrad: ApplyProximalAdagrad (var, then the slots, after steps 1, 2, 3).
const PROXIMAL_ADAGRAD: [[[f64; 3]; 2]; 3] = [
    [
        [0.877372430282474, -1.876990823428837, 0.3973082405115485],
        [0.35, 2.45, 4.3],
    ],
    [
        [0.881075727117444, -1.8954797488527675, 0.39112468496275743],
        [0.4125, 3.0125, 4.3],
    ],
    [
        [0.779608709156158, -1.9236987040875855, 0.4694404867677567],
        [1.4125, 4.0125, 13.3],
    ],
];
/// proximal_adagrad_no_l1: ApplyProximalAdagrad (var, then the slots, after steps 1, 2, 3).
const PROXIMAL_ADAGRAD_NO_L1: [[[f64; 3]; 2]; 3] = [
    [
        [0.8855476015969758, -1.8801449048793797, 0.3996964209647683],
        [0.35, 2.45, 4.3],
    ],
    [
        [0.8965538982773398, -1.9014458389137017, 0.39587823224568847],
        [0.4125, 3.0125, 4.3],
    ],
    [
        [0.7989681291667218, -1.9320772422569472, 0.4755316508321536],
        [1.4125, 4.0125, 13.3],
    ],
];
/// momentum: ApplyMomentum (var, then the slots, after steps 1, 2, 3).
const MOMENTUM: [[[f64; 3]; 2]; 3] = [
    [[0.95, -1.859, 0.309], [0.5, -1.41, 1.91]],
    [
        [0.9299999999999999, -1.8071, 0.1371],
        [0.2, -0.5189999999999999, 1.7189999999999999],
    ],
    [
        [0.8119999999999999, -1.86039, 0.28239000000000003],
        [1.18, 0.5329000000000002, -1.4529],
    ],
];
/// momentum_nesterov: ApplyMomentum (var, then the slots, after steps 1, 2, 3).
const MOMENTUM_NESTEROV: [[[f64; 3]; 2]; 3] = [
    [[0.905, -1.7231, 0.1281], [0.5, -1.41, 1.91]],
    [
        [0.912, -1.75139, -0.026610000000000023],
        [0.2, -0.5189999999999999, 1.7189999999999999],
    ],
    [
        [0.7058, -1.899351, 0.40415100000000004],
        [1.18, 0.5329000000000002, -1.4529],
    ],
];
/// adam: ApplyAdam (var, then the slots, after steps 1, 2, 3).
const ADAM: [[[f64; 3]; 3]; 3] = [
    [
        [0.9905948348715198, -1.990206465828824, 0.4901556527962075],
        [
            0.04999999999999999,
            -0.14999999999999997,
            0.19999999999999996,
        ],
        [
            0.0002500000000000002,
            0.002250000000000002,
            0.0040000000000000036,
        ],
    ],
    [
        [0.9880741149959403, -1.9875924063389745, 0.4835594180703735],
        [0.019999999999999997, -0.06, 0.17999999999999997],
        [
            0.00031225000000000024,
            0.0028102500000000024,
            0.003996000000000004,
        ],
    ],
    [
        [0.9816698124149146, -1.9890743564655522, 0.48598391476800323],
        [
            0.11799999999999997,
            0.045999999999999985,
            -0.13799999999999998,
        ],
        [
            0.0013119377500000011,
            0.003807439750000003,
            0.012992004000000012,
        ],
    ],
];
/// adam_nesterov: ApplyAdam (var, then the slots, after steps 1, 2, 3).
const ADAM_NESTEROV: [[[f64; 3]; 3]; 3] = [
    [
        [0.9821301862558875, -1.9813922850747656, 0.4812957403127942],
        [
            0.04999999999999999,
            -0.14999999999999997,
            0.19999999999999996,
        ],
        [
            0.0002500000000000002,
            0.002250000000000002,
            0.0040000000000000036,
        ],
    ],
    [
        [0.9830124382123404, -1.982307205896213, 0.47535912905954364],
        [0.019999999999999997, -0.06, 0.17999999999999997],
        [
            0.00031225000000000024,
            0.0028102500000000024,
            0.003996000000000004,
        ],
    ],
    [
        [0.9718211908207515, -1.9868625917200842, 0.4828118210822577],
        [
            0.11799999999999997,
            0.045999999999999985,
            -0.13799999999999998,
        ],
        [
            0.0013119377500000011,
            0.003807439750000003,
            0.012992004000000012,
        ],
    ],
];
/// rmsprop: ApplyRMSProp (var, then the slots, after steps 1, 2, 3).
const RMSPROP: [[[f64; 3]; 3]; 3] = [
    [
        [0.9948040554109203, -1.9858641455827186, 0.482465582324232],
        [0.925, 1.125, 1.2999999999999998],
        [
            0.005195944589079658,
            -0.014135854417281326,
            0.017534417675768018,
        ],
    ],
    [
        [0.9949342127462122, -1.9860475892141694, 0.47369837348634797],
        [0.8387500000000001, 1.06875, 1.17],
        [
            -0.00013015733529190285,
            0.00018344363145075728,
            0.008767208837884009,
        ],
    ],
    [
        [0.9841900596304144, -1.995839024468219, 0.4907762148258582],
        [0.854875, 1.0618750000000001, 1.9529999999999998],
        [
            0.010744153115797813,
            0.009791435254049477,
            -0.01707784133951026,
        ],
    ],
];
/// centered_rmsprop: ApplyCenteredRMSProp (var, then the slots, after steps 1, 2, 3).
const CENTERED_RMSPROP: [[[f64; 3]; 4]; 3] = [
    [
        [0.9947970272126732, -1.9857207600922686, 0.4821896500699384],
        [
            0.04999999999999999,
            -0.14999999999999997,
            0.19999999999999996,
        ],
        [0.925, 1.125, 1.2999999999999998],
        [
            0.005202972787326803,
            -0.014279239907731308,
            0.017810349930061597,
        ],
    ],
    [
        [0.9949243204291068, -1.9858447432795017, 0.4732844751049076],
        [0.019999999999999997, -0.06, 0.17999999999999997],
        [0.8387500000000001, 1.06875, 1.17],
        [
            -0.00012729321643363328,
            0.00012398318723313637,
            0.008905174965030798,
        ],
    ],
    [
        [0.9840897214215685, -1.9956161179763836, 0.49039868746839976],
        [
            0.11799999999999997,
            0.045999999999999985,
            -0.13799999999999998,
        ],
        [0.854875, 1.0618750000000001, 1.9529999999999998],
        [
            0.010834599007538376,
            0.009771374696881925,
            -0.017114212363492122,
        ],
    ],
];
/// adadelta: ApplyAdadelta (var, then the slots, after steps 1, 2, 3).
const ADADELTA: [[[f64; 3]; 3]; 3] = [
    [
        [0.5285954792089683, -0.9710084891449473, -0.6547005383792512],
        [
            0.012500000000000011,
            0.1125000000000001,
            0.20000000000000018,
        ],
        [0.01111111111111112, 0.05294117647058825, 0.0666666666666667],
    ],
    [
        [0.7743320728004635, -1.576056093267191, -0.6547005383792512],
        [
            0.015000000000000013,
            0.13500000000000012,
            0.19000000000000017,
        ],
        [
            0.01357487922705315,
            0.06859824780976222,
            0.06333333333333335,
        ],
    ],
    [
        [-0.0572180896162362, -2.3544670528237837, 0.7638622302503546],
        [0.06425000000000006, 0.17825000000000016, 0.6305000000000005],
        [0.0474699188964625, 0.09546451651716491, 0.1607826830937714],
    ],
];
/// ftrl: ApplyFtrl (var, then the slots, after steps 1, 2, 3).
const FTRL: [[[f64; 3]; 3]; 3] = [
    [
        [0.0, -0.9425930601353949, -0.043010195088226746],
        [0.35, 2.35, 4.1],
        [-0.0507604245862473, 3.366972822635005, 0.2913820928851796],
    ],
    [
        [
            0.1191793723528133,
            -1.1392777620397816,
            -0.043010195088226746,
        ],
        [0.4125, 2.9125, 4.1],
        [-0.3007604245862473, 4.444304937072381, 0.2913820928851796],
    ],
    [
        [-0.16890410521380855, -1.36884574712503, 0.32354027197449],
        [1.4125, 3.9125, 13.1],
        [0.5690421169322297, 6.062703147029493, -2.571454391500122],
    ],
];
/// ftrl_lr_power: ApplyFtrl (var, then the slots, after steps 1, 2, 3).
const FTRL_LR_POWER: [[[f64; 3]; 3]; 3] = [
    [
        [0.0, -1.2078578020405482, 0.06681063921745524],
        [0.35, 2.35, 4.1],
        [-0.06007787157377242, 4.976467882343651, -0.4855010311551333],
    ],
    [
        [
            0.14232571917039974,
            -1.3699553593954394,
            0.06681063921745524,
        ],
        [0.4125, 2.9125, 4.1],
        [-0.3100778715737724, 6.438568799633895, -0.4855010311551333],
    ],
    [
        [
            -0.12914058274043447,
            -1.548624288637566,
            0.30663175015073957,
        ],
        [1.4125, 3.9125, 13.1],
        [0.48057197326201306, 8.767563494147993, -3.9357559385508964],
    ],
];
/// ftrl_linear_by_lr: ApplyFtrl (var, then the slots, after steps 1, 2, 3).
const FTRL_LINEAR_BY_LR: [[[f64; 3]; 3]; 3] = [
    [
        [0.0, -0.9425930601353949, -0.043010195088226746],
        [0.35, 2.35, 4.1],
        [-0.02538021229312365, 1.6834864113175025, 0.1456910464425898],
    ],
    [
        [
            0.1191793723528133,
            -1.1392777620397816,
            -0.043010195088226746,
        ],
        [0.4125, 2.9125, 4.1],
        [-0.15038021229312365, 2.2221524685361906, 0.1456910464425898],
    ],
    [
        [-0.16890410521380855, -1.36884574712503, 0.32354027197449],
        [1.4125, 3.9125, 13.1],
        [0.28452105846611486, 3.0313515735147467, -1.285727195750061],
    ],
];
/// ftrl_v2: ApplyFtrlV2 (var, then the slots, after steps 1, 2, 3).
const FTRL_V2: [[[f64; 3]; 3]; 3] = [
    [
        [
            -0.031100984807452527,
            -0.8271843179989803,
            -0.06548366396915853,
        ],
        [0.35, 2.35, 4.1],
        [0.14923957541375266, 2.966972822635005, 0.39138209288517967],
    ],
    [
        [
            0.0022735600074968707,
            -0.9804838196352035,
            -0.06254037380031797,
        ],
        [0.4125, 2.9125, 4.1],
        [-0.10382986471078365, 3.838790346205376, 0.37828536009134794],
    ],
    [
        [
            -0.28597366132747903,
            -1.1650342657439834,
            0.3056475363500261,
        ],
        [1.4125, 3.9125, 13.1],
        [0.8941410975541839, 5.1748986855085946, -2.434775641231535],
    ],
];
/// ftrl_v2_lr_power: ApplyFtrlV2 (var, then the slots, after steps 1, 2, 3).
const FTRL_V2_LR_POWER: [[[f64; 3]; 3]; 3] = [
    [
        [
            -0.02937328923567147,
            -1.1087813531695228,
            0.04947978046014899,
        ],
        [0.35, 2.35, 4.1],
        [
            0.13992212842622753,
            4.5764678823436515,
            -0.38550103115513323,
        ],
    ],
    [
        [
            0.008481249188194775,
            -1.2229507107938988,
            0.04776472628715425,
        ],
        [0.4125, 2.9125, 4.1],
        [-0.11251862831347842, 5.758401323638129, -0.3756050750631034],
    ],
    [
        [
            -0.26356064606081536,
            -1.3579189812333368,
            0.28682217123899795,
        ],
        [1.4125, 3.9125, 13.1],
        [0.8767023581361768, 7.70019655903981, -3.687951495881305],
    ],
];
/// ftrl_v2_linear_by_lr: ApplyFtrlV2 (var, then the slots, after steps 1, 2, 3).
const FTRL_V2_LINEAR_BY_LR: [[[f64; 3]; 3]; 3] = [
    [
        [
            -0.031100984807452527,
            -0.8271843179989803,
            -0.06548366396915853,
        ],
        [0.35, 2.35, 4.1],
        [0.07461978770687633, 1.4834864113175026, 0.19569104644258983],
    ],
    [
        [
            0.0022735600074968707,
            -0.9804838196352035,
            -0.06254037380031797,
        ],
        [0.4125, 2.9125, 4.1],
        [
            -0.051914932355391824,
            1.919395173102688,
            0.18914268004567397,
        ],
    ],
    [
        [
            -0.28597366132747903,
            -1.1650342657439834,
            0.3056475363500261,
        ],
        [1.4125, 3.9125, 13.1],
        [0.44707054877709196, 2.5874493427542973, -1.2173878206157676],
    ],
];
/// adamax: ApplyAdaMax (var, then the slots, after steps 1, 2, 3).
const ADAMAX: [[[f64; 3]; 3]; 3] = [
    [
        [0.9900199600798403, -1.9900066622251833, 0.4900049975012494],
        [
            0.04999999999999999,
            -0.14999999999999997,
            0.19999999999999996,
        ],
        [0.5, 1.5, 2.0],
    ],
    [
        [0.9879168000819435, -1.9879006970789064, 0.48526578579013063],
        [0.019999999999999997, -0.06, 0.17999999999999997],
        [0.4995, 1.4985, 1.998],
    ],
    [
        [0.9835669064331568, -1.9890338180899132, 0.48696263714718135],
        [
            0.11799999999999997,
            0.045999999999999985,
            -0.13799999999999998,
        ],
        [1.0, 1.4970014999999999, 3.0],
    ],
];
/// add_sign: ApplyAddSign (var, then the slots, after steps 1, 2, 3).
const ADD_SIGN: [[[f64; 3]; 2]; 3] = [
    [
        [0.925, -1.925, 0.4],
        [
            0.04999999999999999,
            0.30000000000000004,
            -0.25000000000000006,
        ],
    ],
    [
        [0.9375, -2.0375, 0.4],
        [
            0.019999999999999997,
            0.3450000000000001,
            -0.22500000000000006,
        ],
    ],
    [
        [0.7875, -2.1875, 0.8500000000000001],
        [0.11799999999999998, 0.4105000000000001, -0.5025],
    ],
];
/// power_sign: ApplyPowerSign (var, then the slots, after steps 1, 2, 3).
const POWER_SIGN: [[[f64; 3]; 2]; 3] = [
    [
        [0.9292893218813453, -1.8939339828220179, 0.35857864376269044],
        [
            0.04999999999999999,
            0.30000000000000004,
            -0.25000000000000006,
        ],
    ],
    [
        [0.9469669914110089, -2.0, 0.35857864376269044],
        [
            0.019999999999999997,
            0.3450000000000001,
            -0.22500000000000006,
        ],
    ],
    [
        [0.8055456351736994, -2.1414213562373097, 0.7828427124746189],
        [0.11799999999999998, 0.4105000000000001, -0.5025],
    ],
];
const SCATTER_SEQUENCE: [[[f64; 2]; 4]; 7] = [
    [[1.0, 2.0], [-1.0, -2.0], [5.0, 6.0], [9.0, 9.5]],
    [[4.0, 5.0], [-1.0, -2.0], [5.0, 6.0], [9.0, 9.5]],
    [[4.0, 5.0], [-1.0, -2.0], [4.5, 5.75], [9.0, 9.5]],
    [[4.0, 5.0], [-3.0, 6.0], [4.5, 5.75], [9.0, 9.5]],
    [[2.0, 2.5], [-3.0, 6.0], [4.5, 5.75], [4.5, 4.75]],
    [[0.0, 2.5], [-3.0, 0.0], [4.5, 5.75], [4.5, 4.75]],
    [[0.0, 2.5], [-3.0, 0.0], [5.0, 5.75], [4.5, 5.0]],
];

const B1: f64 = 0.9;
const B2: f64 = 0.999;

/// One optimizer case of tests/kernels_ref_golden.py.
struct Case {
    name: &'static str,
    /// The op without `Apply` / `ResourceApply`.
    rule: &'static str,
    /// The slots' starting values, in input order.
    slots: Vec<[f64; 3]>,
    /// The hyper-parameters of step `k` (1, 2, 3) by input name.
    params: fn(i32) -> Vec<(&'static str, f64)>,
    attrs: Vec<(&'static str, bool)>,
    /// TensorFlow's values after each step: var, then the slots.
    golden: Vec<Vec<[f64; 3]>>,
}

fn steps<const K: usize>(golden: &[[[f64; 3]; K]; 3]) -> Vec<Vec<[f64; 3]>> {
    golden.iter().map(|step| step.to_vec()).collect()
}

fn case<const K: usize>(
    name: &'static str,
    rule: &'static str,
    slots: &[[f64; 3]],
    params: fn(i32) -> Vec<(&'static str, f64)>,
    attrs: &[(&'static str, bool)],
    golden: &[[[f64; 3]; K]; 3],
) -> Case {
    assert_eq!(K, 1 + slots.len(), "{name}: a golden row per variable");
    Case {
        name,
        rule,
        slots: slots.to_vec(),
        params,
        attrs: attrs.to_vec(),
        golden: steps(golden),
    }
}

/// The cases of tests/kernels_ref_golden.py, with the same inputs.
fn cases() -> Vec<Case> {
    let accum = [0.1, 0.2, 0.3];
    let zeros = [0.0; 3];
    let ftrl = [[0.1; 3], zeros];
    let sign_m = [0.0, 0.5, -0.5];
    vec![
        case(
            "gradient_descent",
            "GradientDescent",
            &[],
            |_| vec![("alpha", 0.1)],
            &[],
            &GRADIENT_DESCENT,
        ),
        case(
            "proximal_gradient_descent",
            "ProximalGradientDescent",
            &[],
            |_| vec![("alpha", 0.1), ("l1", 0.05), ("l2", 0.2)],
            &[],
            &PROXIMAL_GRADIENT_DESCENT,
        ),
        case(
            "proximal_gradient_descent_no_l1",
            "ProximalGradientDescent",
            &[],
            |_| vec![("alpha", 0.1), ("l1", 0.0), ("l2", 0.2)],
            &[],
            &PROXIMAL_GRADIENT_DESCENT_NO_L1,
        ),
        case(
            "adagrad",
            "Adagrad",
            &[accum],
            |_| vec![("lr", 0.1)],
            &[],
            &ADAGRAD,
        ),
        case(
            "adagrad_frozen_slots",
            "Adagrad",
            &[accum],
            |_| vec![("lr", 0.1)],
            &[("update_slots", false)],
            &ADAGRAD_FROZEN_SLOTS,
        ),
        case(
            "adagrad_v2",
            "AdagradV2",
            &[accum],
            |_| vec![("lr", 0.1), ("epsilon", 0.01)],
            &[],
            &ADAGRAD_V2,
        ),
        case(
            "proximal_adagrad",
            "ProximalAdagrad",
            &[accum],
            |_| vec![("lr", 0.1), ("l1", 0.05), ("l2", 0.2)],
            &[],
            &PROXIMAL_ADAGRAD,
        ),
        case(
            "proximal_adagrad_no_l1",
            "ProximalAdagrad",
            &[accum],
            |_| vec![("lr", 0.1), ("l1", 0.0), ("l2", 0.2)],
            &[],
            &PROXIMAL_ADAGRAD_NO_L1,
        ),
        case(
            "momentum",
            "Momentum",
            &[[0.0, 0.1, -0.1]],
            |_| vec![("lr", 0.1), ("momentum", 0.9)],
            &[],
            &MOMENTUM,
        ),
        case(
            "momentum_nesterov",
            "Momentum",
            &[[0.0, 0.1, -0.1]],
            |_| vec![("lr", 0.1), ("momentum", 0.9)],
            &[("use_nesterov", true)],
            &MOMENTUM_NESTEROV,
        ),
        case("adam", "Adam", &[zeros, zeros], adam_params, &[], &ADAM),
        case(
            "adam_nesterov",
            "Adam",
            &[zeros, zeros],
            adam_params,
            &[("use_nesterov", true)],
            &ADAM_NESTEROV,
        ),
        case(
            "rmsprop",
            "RMSProp",
            &[[1.0; 3], zeros],
            rmsprop_params,
            &[],
            &RMSPROP,
        ),
        case(
            "centered_rmsprop",
            "CenteredRMSProp",
            &[zeros, [1.0; 3], zeros],
            rmsprop_params,
            &[],
            &CENTERED_RMSPROP,
        ),
        case(
            "adadelta",
            "Adadelta",
            &[zeros, zeros],
            |_| vec![("lr", 1.0), ("rho", 0.95), ("epsilon", 0.1)],
            &[],
            &ADADELTA,
        ),
        case(
            "ftrl",
            "Ftrl",
            &ftrl,
            |_| ftrl_params(-0.5, None),
            &[],
            &FTRL,
        ),
        case(
            "ftrl_lr_power",
            "Ftrl",
            &ftrl,
            |_| ftrl_params(-0.7, None),
            &[],
            &FTRL_LR_POWER,
        ),
        case(
            "ftrl_linear_by_lr",
            "Ftrl",
            &ftrl,
            |_| ftrl_params(-0.5, None),
            &[("multiply_linear_by_lr", true)],
            &FTRL_LINEAR_BY_LR,
        ),
        case(
            "ftrl_v2",
            "FtrlV2",
            &ftrl,
            |_| ftrl_params(-0.5, Some(0.1)),
            &[],
            &FTRL_V2,
        ),
        case(
            "ftrl_v2_lr_power",
            "FtrlV2",
            &ftrl,
            |_| ftrl_params(-0.7, Some(0.1)),
            &[],
            &FTRL_V2_LR_POWER,
        ),
        case(
            "ftrl_v2_linear_by_lr",
            "FtrlV2",
            &ftrl,
            |_| ftrl_params(-0.5, Some(0.1)),
            &[("multiply_linear_by_lr", true)],
            &FTRL_V2_LINEAR_BY_LR,
        ),
        case(
            "adamax",
            "AdaMax",
            &[zeros, zeros],
            |k| {
                vec![
                    ("beta1_power", B1.powi(k)),
                    ("lr", 0.01),
                    ("beta1", B1),
                    ("beta2", B2),
                    ("epsilon", 1e-3),
                ]
            },
            &[],
            &ADAMAX,
        ),
        case(
            "add_sign",
            "AddSign",
            &[sign_m],
            |_| {
                vec![
                    ("lr", 0.1),
                    ("alpha", 1.0),
                    ("sign_decay", 0.5),
                    ("beta", 0.9),
                ]
            },
            &[],
            &ADD_SIGN,
        ),
        case(
            "power_sign",
            "PowerSign",
            &[sign_m],
            |_| {
                vec![
                    ("lr", 0.1),
                    ("logbase", std::f64::consts::LN_2),
                    ("sign_decay", 0.5),
                    ("beta", 0.9),
                ]
            },
            &[],
            &POWER_SIGN,
        ),
    ]
}

fn adam_params(k: i32) -> Vec<(&'static str, f64)> {
    vec![
        ("beta1_power", B1.powi(k)),
        ("beta2_power", B2.powi(k)),
        ("lr", 0.01),
        ("beta1", B1),
        ("beta2", B2),
        ("epsilon", 1e-3),
    ]
}

fn rmsprop_params(_: i32) -> Vec<(&'static str, f64)> {
    vec![
        ("lr", 0.01),
        ("rho", 0.9),
        ("momentum", 0.5),
        ("epsilon", 1e-3),
    ]
}

fn ftrl_params(lr_power: f64, l2_shrinkage: Option<f64>) -> Vec<(&'static str, f64)> {
    let mut p = vec![
        ("lr", 0.5),
        ("l1", 0.1),
        ("l2", 0.2),
        ("lr_power", lr_power),
    ];
    if let Some(s) = l2_shrinkage {
        p.push(("l2_shrinkage", s));
    }
    p
}

/// A float32 or float64 tensor of `dims` holding `values`.
fn floats(dtype: DType, dims: &[usize], values: &[f64]) -> Tensor {
    match dtype {
        DType::Float => f32s(dims, &values.iter().map(|&v| v as f32).collect::<Vec<_>>()),
        _ => f64s(dims, values),
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Form {
    Ref,
    Resource,
}

/// A handle to variable `name` of this test's device.
fn handle(name: &str) -> Tensor {
    Tensor::resource(ResourceHandle {
        device: DEVICE.into(),
        container: String::new(),
        name: name.into(),
        type_name: "Var".into(),
    })
}

/// Creates variable `name` in `rm` holding `value`, as VariableV2 + Assign (or VarHandleOp +
/// AssignVariableOp) would, and returns it.
fn new_var(rm: &ResourceMgr, name: &str, value: Tensor) -> Arc<Var> {
    let var: Arc<Var> = rm
        .lookup_or_create("", name, || {
            Ok(Var::new(value.dtype(), PartialShape::from(value.shape())))
        })
        .unwrap();
    *var.write() = Some(value);
    var
}

/// Runs `case` for three steps in `form`; returns the values after each step (var, then the
/// slots).
fn run_case(case: &Case, form: Form, dtype: DType, use_locking: bool) -> Vec<Vec<Vec<f64>>> {
    let op = match form {
        Form::Ref => format!("Apply{}", case.rule),
        Form::Resource => format!("ResourceApply{}", case.rule),
    };
    let def = registry::global()
        .get(&op)
        .unwrap_or_else(|| panic!("{op} is registered"));
    let rm = ResourceMgr::new();
    let starts: Vec<[f64; 3]> = std::iter::once(VAR0)
        .chain(case.slots.iter().copied())
        .collect();
    let names: Vec<String> = (0..starts.len())
        .map(|i| format!("{}/v{i}", case.name))
        .collect();
    let vars: Vec<Arc<Var>> = starts
        .iter()
        .zip(&names)
        .map(|(v, name)| new_var(&rm, name, floats(dtype, &[3], v)))
        .collect();
    let mut node = node(&op)
        .name(case.name)
        .t(dtype)
        .attr("use_locking", value::bool(use_locking));
    for &(k, v) in &case.attrs {
        node = node.attr(k, value::bool(v));
    }
    let node = node.build();
    let kernel = create_kernel(&node, DeviceType::Cpu).unwrap();
    let mut after = Vec::new();
    for (k, grad) in (1..).zip(GRADS) {
        let params = (case.params)(k);
        let inputs: Vec<Tensor> = def
            .inputs
            .iter()
            .enumerate()
            .map(|(i, arg)| {
                if i < vars.len() {
                    return match form {
                        Form::Ref => Tensor::reference(vars[i].clone(), names[i].as_str()),
                        Form::Resource => handle(&names[i]),
                    };
                }
                if arg.name == "grad" || arg.name == "delta" {
                    return floats(dtype, &[3], &grad);
                }
                let &(_, v) = params
                    .iter()
                    .find(|(n, _)| *n == arg.name)
                    .unwrap_or_else(|| panic!("{}: no value for input {}", case.name, arg.name));
                floats(dtype, &[], &[v])
            })
            .collect();
        let mut ctx = OpContext::new(&node, inputs, &rm, DEVICE, k as i64);
        kernel
            .compute(&mut ctx)
            .unwrap_or_else(|e| panic!("{op} ({}) step {k}: {e}", case.name));
        let outputs = ctx.take_outputs();
        match form {
            Form::Ref => {
                let out = outputs[0]
                    .as_ref()
                    .expect("ApplyX outputs the variable's ref");
                let (var, name) = out.referenced().expect("a reference");
                assert!(
                    Arc::ptr_eq(var, &vars[0]),
                    "{op}: output 0 is the var's ref"
                );
                assert_eq!(name, names[0]);
            }
            Form::Resource => assert!(outputs.is_empty(), "{op} has no outputs"),
        }
        after.push(
            vars.iter()
                .map(|v| as_f64s(&v.snapshot().unwrap()))
                .collect(),
        );
    }
    after
}

fn assert_golden(case: &Case, got: &[Vec<Vec<f64>>], tol: f64, what: &str) {
    for (k, (step, want)) in got.iter().zip(&case.golden).enumerate() {
        for (v, (got, want)) in step.iter().zip(want).enumerate() {
            for (i, (g, w)) in got.iter().zip(want).enumerate() {
                assert!(
                    (g - w).abs() <= tol * w.abs().max(1.0),
                    "{} ({what}) step {}, variable {v}, element {i}: got {g}, TensorFlow {w}",
                    case.name,
                    k + 1
                );
            }
        }
    }
}

#[test]
fn every_rule_matches_tensorflow_in_float64_in_both_forms_locked_or_not() {
    for case in cases() {
        let reference = run_case(&case, Form::Ref, DType::Double, false);
        assert_golden(&case, &reference, 1e-12, "ApplyX float64");
        for (form, use_locking) in [
            (Form::Ref, true),
            (Form::Resource, false),
            (Form::Resource, true),
        ] {
            let got = run_case(&case, form, DType::Double, use_locking);
            assert_eq!(
                got, reference,
                "{}: {form:?} form with use_locking={use_locking} differs from the ref form",
                case.name
            );
        }
    }
}

#[test]
fn every_rule_matches_tensorflow_in_float32() {
    for case in cases() {
        for form in [Form::Ref, Form::Resource] {
            let got = run_case(&case, form, DType::Float, true);
            assert_golden(&case, &got, 2e-5, &format!("{form:?} float32"));
        }
    }
}

#[test]
fn the_kernels_take_the_inputs_the_registry_declares() {
    // ApplyFtrl's gradient comes before its hyper-parameters, ApplyMomentum's before
    // momentum: the kernel reads them where TensorFlow's signature puts them.
    for (op, refs, outputs) in [
        (
            "ApplyFtrl",
            vec![true, true, true, false, false, false, false, false],
            1,
        ),
        ("ApplyAdam", [vec![true; 3], vec![false; 7]].concat(), 1),
        ("ResourceApplyAdaMax", vec![false; 9], 0),
        ("ApplyGradientDescent", vec![true, false, false], 1),
    ] {
        let def = registry::global().get(op).unwrap();
        let mut node = node(op).t(DType::Float).build();
        def.fill_and_check_attrs(&mut node).unwrap();
        assert_eq!(def.ref_inputs(&node).unwrap(), refs, "{op}");
        assert_eq!(def.ref_outputs(&node).unwrap(), vec![true; outputs], "{op}");
    }
    let mut assign = node("Assign").t(DType::Float).build();
    registry::global()
        .get("Assign")
        .unwrap()
        .fill_and_check_attrs(&mut assign)
        .unwrap();
    for flag in ["validate_shape", "use_locking"] {
        assert!(
            tessera::graph::attr::bool_or(&assign, flag, false).unwrap(),
            "Assign's {flag} defaults to true"
        );
    }
}

#[test]
fn proximal_adagrad_wants_a_positive_rate_and_non_negative_strengths() {
    let rm = ResourceMgr::new();
    let (var, accum) = (
        new_var(&rm, "w", f32s(&[1], &[1.0])),
        new_var(&rm, "w/accum", f32s(&[1], &[0.1])),
    );
    let n = node("ApplyProximalAdagrad").name("prox").build();
    for (lr, l1, l2, needle) in [
        (0.0, 0.0, 0.0, "lr is not a positive scalar"),
        (
            0.1,
            -1.0,
            0.0,
            "l1 regularization strength is not a non-negative scalar",
        ),
        (
            0.1,
            0.0,
            -1.0,
            "l2 regularization strength is not a non-negative scalar",
        ),
    ] {
        let inputs = vec![
            Tensor::reference(var.clone(), "w"),
            Tensor::reference(accum.clone(), "w/accum"),
            f32s(&[], &[lr]),
            f32s(&[], &[l1]),
            f32s(&[], &[l2]),
            f32s(&[1], &[1.0]),
        ];
        let err = run_with(&n, inputs, &rm).unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{err}");
        assert!(err.message().contains(needle), "{err}");
        assert!(err.message().contains("node `prox`"), "{err}");
    }
    assert_f32(&var.snapshot().unwrap(), &[1], &[1.0], 0.0);
}

#[test]
fn an_update_names_mismatched_slots_and_gradients() {
    let rm = ResourceMgr::new();
    let var = new_var(&rm, "w", f32s(&[2], &[1.0, 2.0]));
    let accum = new_var(&rm, "w/accum", f32s(&[3], &[0.1; 3]));
    let refs = || {
        vec![
            Tensor::reference(var.clone(), "w"),
            Tensor::reference(accum.clone(), "w/accum"),
        ]
    };
    let n = node("ApplyAdagrad").name("adagrad").build();
    let mut inputs = refs();
    inputs.extend([f32s(&[], &[0.1]), f32s(&[2], &[1.0, 1.0])]);
    let err = run_with(&n, inputs, &rm).unwrap_err();
    assert!(
        err.message()
            .contains("var and accum do not have the same shape[2] [3]"),
        "{err}"
    );
    // The variable passed as its own slot.
    let mut inputs = vec![
        Tensor::reference(var.clone(), "w"),
        Tensor::reference(var.clone(), "w"),
    ];
    inputs.extend([f32s(&[], &[0.1]), f32s(&[2], &[1.0, 1.0])]);
    let err = run_with(&n, inputs, &rm).unwrap_err();
    assert!(err.message().contains("passed twice"), "{err}");
    // A value where the op wants a reference.
    let inputs = vec![
        f32s(&[2], &[1.0, 2.0]),
        Tensor::reference(accum.clone(), "w/accum"),
        f32s(&[], &[0.1]),
        f32s(&[2], &[1.0, 1.0]),
    ];
    let err = run_with(&n, inputs, &rm).unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("must be a reference"), "{err}");
}

// ---------------------------------------------------------------------------------------------
// Reference variables
// ---------------------------------------------------------------------------------------------

fn variable_v2(name: &str, dtype: DType, dims: &[usize]) -> NodeBuilder {
    node("VariableV2")
        .name(name)
        .attr("dtype", value::dtype(dtype))
        .attr(
            "shape",
            value::shape(&PartialShape::from(Shape::new(dims.to_vec()))),
        )
}

/// Runs a VariableV2-like node once and returns its reference output.
fn reference(rm: &ResourceMgr, n: NodeBuilder) -> Tensor {
    let out = run_with(&n.build(), vec![], rm).unwrap().remove(0);
    assert!(out.is_ref(), "{out:?}");
    out
}

fn assign(rm: &ResourceMgr, r: &Tensor, value: Tensor) -> tessera::Result<Tensor> {
    Ok(run_with(
        &node("Assign").name("assign").build(),
        vec![r.clone(), value],
        rm,
    )?
    .remove(0))
}

#[test]
fn an_assign_through_one_reference_is_seen_through_every_other() {
    let rm = ResourceMgr::new();
    let first = reference(&rm, variable_v2("w", DType::Float, &[3]));
    // A second run of the node, and another node sharing it by shared_name: one variable.
    let again = reference(&rm, variable_v2("w", DType::Float, &[3]));
    let shared = reference(
        &rm,
        variable_v2("other", DType::Float, &[3]).attr("shared_name", value::string("w")),
    );
    let is_init = node("IsVariableInitialized").attr("dtype", value::dtype(DType::Float));
    let initialized = |r: &Tensor| {
        run_with(&is_init.def().clone(), vec![r.clone()], &rm).unwrap()[0]
            .scalar_value::<bool>()
            .unwrap()
    };
    assert!(!initialized(&shared));
    let out = assign(&rm, &first, f32s(&[3], &[1.0, 2.0, 3.0])).unwrap();
    assert!(out.is_ref(), "Assign outputs the reference");
    assert!(initialized(&shared));
    for r in [&first, &again, &shared, &out] {
        assert_f32(&r.deref().unwrap(), &[3], &[1.0, 2.0, 3.0], 0.0);
    }
    // Chained through the output ref: Assign -> AssignAdd -> RefIdentity.
    let added = run_with(
        &node("AssignAdd").build(),
        vec![out, f32s(&[3], &[0.5, 0.5, 0.5])],
        &rm,
    )
    .unwrap()
    .remove(0);
    let ident = run_with(&node("RefIdentity").build(), vec![added], &rm)
        .unwrap()
        .remove(0);
    assert!(ident.is_ref());
    assert_f32(&shared.deref().unwrap(), &[3], &[1.5, 2.5, 3.5], 0.0);
    assert_f32(&ident.deref().unwrap(), &[3], &[1.5, 2.5, 3.5], 0.0);
    // A resource handle naming the same (container, name) reads the same storage: what a
    // checkpoint or VarHandleOp finds by that name.
    let read = node("ReadVariableOp").attr("dtype", value::dtype(DType::Float));
    let value = run_with(&read.build(), vec![handle("w")], &rm)
        .unwrap()
        .remove(0);
    assert_f32(&value, &[3], &[1.5, 2.5, 3.5], 0.0);
}

#[test]
fn sharing_a_variable_with_another_dtype_is_an_error() {
    let rm = ResourceMgr::new();
    reference(&rm, variable_v2("w", DType::Float, &[2]));
    let err = run_with(&variable_v2("w", DType::Int64, &[2]).build(), vec![], &rm).unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(
        err.message().contains("Trying to share variable `w`"),
        "{err}"
    );
}

#[test]
fn assign_validates_shapes_unless_told_not_to() {
    let rm = ResourceMgr::new();
    let w = reference(&rm, variable_v2("w", DType::Float, &[3]));
    // Uninitialized: the declared shape is what the value must have.
    let err = assign(&rm, &w, f32s(&[2], &[1.0, 2.0])).unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(
        err.message().contains(
            "Assign requires shapes of both tensors to match. lhs shape= [3] rhs shape= [2]"
        ),
        "{err}"
    );
    assert!(err.message().contains("node `assign`"), "{err}");
    assign(&rm, &w, f32s(&[3], &[1.0, 2.0, 3.0])).unwrap();
    let err = assign(&rm, &w, f32s(&[2], &[1.0, 2.0])).unwrap_err();
    assert!(
        err.message().contains("lhs shape= [3] rhs shape= [2]"),
        "{err}"
    );
    assert_f32(&w.deref().unwrap(), &[3], &[1.0, 2.0, 3.0], 0.0);
    // validate_shape=false gives the variable the value's shape.
    let reshape = node("Assign")
        .attr("validate_shape", value::bool(false))
        .build();
    run_with(&reshape, vec![w.clone(), f32s(&[2], &[7.0, 8.0])], &rm).unwrap();
    assert_f32(&w.deref().unwrap(), &[2], &[7.0, 8.0], 0.0);
    // The dtype is the variable's either way.
    let err = assign(&rm, &w, i32s(&[2], &[1, 2])).unwrap_err();
    assert!(err.message().contains("holds float32"), "{err}");
}

#[test]
fn using_an_uninitialized_variable_is_failed_precondition_naming_it_and_the_node() {
    let rm = ResourceMgr::new();
    let w = reference(&rm, variable_v2("w", DType::Float, &[2]));
    let accum = reference(&rm, variable_v2("w/accum", DType::Float, &[2]));
    // A reader: what the executor's deref of a Ref edge says, as TensorFlow's `w/read` does.
    let err = w.deref().unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition);
    assert!(
        err.message()
            .contains("Attempting to use uninitialized value w"),
        "{err}"
    );
    for (n, inputs) in [
        (
            node("AssignAdd").name("add"),
            vec![w.clone(), f32s(&[2], &[1.0, 1.0])],
        ),
        (
            node("ScatterUpdate").name("scatter"),
            vec![w.clone(), ivec(&[0]), f32s(&[1], &[1.0])],
        ),
        (
            node("ApplyGradientDescent").name("sgd"),
            vec![w.clone(), f32s(&[], &[0.1]), f32s(&[2], &[1.0, 1.0])],
        ),
    ] {
        let what = n.def().name.clone();
        let err = n.run_on(inputs, &rm).unwrap_err();
        assert_eq!(err.code(), Code::FailedPrecondition, "{err}");
        assert!(
            err.message()
                .contains("Attempting to use uninitialized value w:"),
            "{err}"
        );
        assert!(err.message().contains(&format!("node `{what}`")), "{err}");
    }
    // A slot that is uninitialized is named, not the variable.
    assign(&rm, &w, f32s(&[2], &[1.0, 1.0])).unwrap();
    let err = node("ApplyAdagrad")
        .name("adagrad")
        .run_on(
            vec![w.clone(), accum, f32s(&[], &[0.1]), f32s(&[2], &[1.0, 1.0])],
            &rm,
        )
        .unwrap_err();
    assert!(
        err.message()
            .contains("Attempting to use uninitialized value w/accum"),
        "{err}"
    );
    assert_f32(&w.deref().unwrap(), &[2], &[1.0, 1.0], 0.0);
}

#[test]
fn is_variable_initialized_and_assign_sub() {
    let rm = ResourceMgr::new();
    let c = reference(&rm, variable_v2("c", DType::Int64, &[2]));
    assign(&rm, &c, i64s(&[2], &[10, 20])).unwrap();
    let sub = node("AssignSub").name("sub");
    let out = sub
        .run_on(vec![c.clone(), i64s(&[2], &[3, 30])], &rm)
        .unwrap();
    assert!(out[0].is_ref());
    assert_exact(&c.deref().unwrap(), &[2], &[7i64, -10]);
    let err = node("AssignSub")
        .name("sub")
        .run_on(vec![c.clone(), i64s(&[3], &[1, 1, 1])], &rm)
        .unwrap_err();
    assert!(
        err.message().contains(
            "Cannot update variable `c` with shape [2] using a Tensor with shape [3], shapes \
             must be equal."
        ),
        "{err}"
    );
}

#[test]
fn scatter_updates_follow_tensorflow() {
    let rm = ResourceMgr::new();
    let w = reference(&rm, variable_v2("w", DType::Float, &[4, 2]));
    assign(
        &rm,
        &w,
        f32s(&[4, 2], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]),
    )
    .unwrap();
    // The sequence of tests/kernels_ref_golden.py: indices of several shapes and both index
    // dtypes, scalar updates, repeated indices.
    let steps: Vec<(&str, Tensor, Tensor)> = vec![
        (
            "ScatterUpdate",
            i32s(&[2, 1], &[3, 1]),
            f32s(&[2, 1, 2], &[9.0, 9.5, -1.0, -2.0]),
        ),
        (
            "ScatterAdd",
            i64s(&[2], &[0, 0]),
            f32s(&[2, 2], &[1.0, 1.0, 2.0, 2.0]),
        ),
        ("ScatterSub", i32s(&[1], &[2]), f32s(&[1, 2], &[0.5, 0.25])),
        ("ScatterMul", i32s(&[], &[1]), f32s(&[2], &[3.0, -3.0])),
        ("ScatterDiv", i64s(&[2], &[3, 0]), f32s(&[], &[2.0])),
        (
            "ScatterMin",
            i32s(&[2], &[0, 1]),
            f32s(&[2, 2], &[0.0, 10.0, 10.0, 0.0]),
        ),
        (
            "ScatterMax",
            i32s(&[2], &[2, 3]),
            f32s(&[2, 2], &[5.0, -5.0, -5.0, 5.0]),
        ),
    ];
    for (use_locking, (i, (op, indices, updates))) in [false, true]
        .into_iter()
        .cycle()
        .zip(steps.into_iter().enumerate())
    {
        let n = node(op)
            .name(op)
            .attr("use_locking", value::bool(use_locking));
        let out = n.run_on(vec![w.clone(), indices, updates], &rm).unwrap();
        assert!(out[0].is_ref(), "{op} outputs the reference");
        let want: Vec<f64> = SCATTER_SEQUENCE[i].iter().flatten().copied().collect();
        assert_f32(&w.deref().unwrap(), &[4, 2], &want, 0.0);
    }
}

#[test]
fn scatter_rejects_bad_indices_and_shapes_and_changes_nothing() {
    let rm = ResourceMgr::new();
    let w = reference(&rm, variable_v2("w", DType::Float, &[3]));
    assign(&rm, &w, f32s(&[3], &[1.0, 2.0, 3.0])).unwrap();
    for (indices, updates, needle) in [
        // TensorFlow's own words for this one (it applies the good indices before the bad one;
        // tessera checks them all first).
        (
            ivec(&[0, 5]),
            f32s(&[2], &[1.0, 1.0]),
            "indices[1] = 5 is not in [0, 3)",
        ),
        (
            i64s(&[1], &[-1]),
            f32s(&[1], &[1.0]),
            "indices[0] = -1 is not in [0, 3)",
        ),
        (
            i32s(&[2, 2], &[0, 1, 2, 3]),
            f32s(&[2, 2], &[1.0; 4]),
            "indices[1,1] = 3 is not in [0, 3)",
        ),
        (
            ivec(&[0, 1]),
            f32s(&[3], &[1.0; 3]),
            "Must have updates.shape = indices.shape + params.shape[1:] or updates.shape = [], \
             got updates.shape [3], indices.shape [2], params.shape [3]",
        ),
        (
            f32s(&[1], &[0.0]),
            f32s(&[1], &[1.0]),
            "indices must be int32 or int64",
        ),
    ] {
        let err = node("ScatterAdd")
            .name("scatter")
            .run_on(vec![w.clone(), indices, updates], &rm)
            .unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{err}");
        assert!(err.message().contains(needle), "{err}");
        assert!(err.message().contains("node `scatter`"), "{err}");
        assert_f32(&w.deref().unwrap(), &[3], &[1.0, 2.0, 3.0], 0.0);
    }
    // A scalar variable has no rows.
    let s = reference(&rm, variable_v2("s", DType::Float, &[]));
    assign(&rm, &s, f32s(&[], &[1.0])).unwrap();
    let err = node("ScatterUpdate")
        .run_on(vec![s, ivec(&[0]), f32s(&[1], &[1.0])], &rm)
        .unwrap_err();
    assert!(
        err.message().contains("params must be at least 1-D"),
        "{err}"
    );
    // Integer division by zero would be undefined: refused, naming the op.
    let n = reference(&rm, variable_v2("n", DType::Int32, &[2]));
    assign(&rm, &n, i32s(&[2], &[4, 6])).unwrap();
    let err = node("ScatterDiv")
        .run_on(vec![n.clone(), ivec(&[1]), i32s(&[1], &[0])], &rm)
        .unwrap_err();
    assert!(err.message().contains("ScatterDiv by zero"), "{err}");
    node("ScatterDiv")
        .run_on(vec![n.clone(), ivec(&[1]), i32s(&[1], &[4])], &rm)
        .unwrap();
    assert_exact(&n.deref().unwrap(), &[2], &[4i32, 1]);
    // ScatterUpdate takes bools too.
    let b = reference(&rm, variable_v2("b", DType::Bool, &[3]));
    assign(&rm, &b, bools(&[3], &[false; 3])).unwrap();
    node("ScatterUpdate")
        .run_on(
            vec![b.clone(), ivec(&[2, 0]), bools(&[2], &[true, true])],
            &rm,
        )
        .unwrap();
    assert_exact(&b.deref().unwrap(), &[3], &[true, false, true]);
}

#[test]
fn count_up_to_returns_the_old_value_until_the_limit() {
    for dtype in [DType::Int32, DType::Int64] {
        let rm = ResourceMgr::new();
        let c = reference(&rm, variable_v2("c", dtype, &[]));
        let zero = match dtype {
            DType::Int32 => i32s(&[], &[0]),
            _ => i64s(&[], &[0]),
        };
        assign(&rm, &c, zero).unwrap();
        let count = || {
            node("CountUpTo")
                .name("count")
                .attr("limit", value::int(2))
                .run_on(vec![c.clone()], &rm)
        };
        let as_i64 = |t: &Tensor| match t.dtype() {
            DType::Int32 => i64::from(t.scalar_value::<i32>().unwrap()),
            _ => t.scalar_value::<i64>().unwrap(),
        };
        assert_eq!(as_i64(&count().unwrap()[0]), 0);
        assert_eq!(as_i64(&count().unwrap()[0]), 1);
        let err = count().unwrap_err();
        assert_eq!(err.code(), Code::OutOfRange);
        assert!(err.message().contains("Reached limit of 2"), "{err}");
        assert!(err.message().contains("node `count`"), "{err}");
        assert_eq!(as_i64(&c.deref().unwrap()), 2);
    }
}

#[test]
fn a_temporary_variable_lives_until_destroyed_and_hands_back_its_value() {
    let rm = ResourceMgr::new();
    let tmp = node("TemporaryVariable")
        .name("tmp")
        .attr("dtype", value::dtype(DType::Float))
        .attr("shape", value::shape(&PartialShape::new(vec![Some(2)])))
        .attr("var_name", value::string("acc"));
    let r = run_with(&tmp.def().clone(), vec![], &rm).unwrap().remove(0);
    assert_f32(&r.deref().unwrap(), &[2], &[0.0, 0.0], 0.0);
    assert_eq!(rm.len(), 1);
    // A second one of the same name in the same step and iteration collides.
    let err = run_with(&tmp.def().clone(), vec![], &rm).unwrap_err();
    assert_eq!(err.code(), Code::AlreadyExists, "{err}");
    node("AssignAdd")
        .run_on(vec![r.clone(), f32s(&[2], &[1.5, -2.0])], &rm)
        .unwrap();
    let destroy = node("DestroyTemporaryVariable")
        .name("destroy")
        .attr("var_name", value::string("acc"));
    let value = run_with(&destroy.def().clone(), vec![r.clone()], &rm)
        .unwrap()
        .remove(0);
    assert!(!value.is_ref());
    assert_f32(&value, &[2], &[1.5, -2.0], 0.0);
    assert_eq!(rm.len(), 0, "the temporary variable is gone");
    let err = run_with(&destroy.build(), vec![r], &rm).unwrap_err();
    assert_eq!(err.code(), Code::NotFound, "{err}");
    // var_name is required to destroy.
    let err = create_kernel(&node("DestroyTemporaryVariable").build(), DeviceType::Cpu)
        .err()
        .expect("no kernel without var_name");
    assert!(
        err.message().contains("Missing var_name attribute"),
        "{err}"
    );
}

// ---------------------------------------------------------------------------------------------
// Locking
// ---------------------------------------------------------------------------------------------

const THREADS: usize = 2;
const N: usize = 500;

/// Runs `THREADS` threads that each run `n` `N` times on `inputs`.
fn hammer(n: &NodeDef, inputs: &[Tensor], rm: &ResourceMgr) {
    let kernel = create_kernel(n, DeviceType::Cpu).unwrap();
    std::thread::scope(|s| {
        for _ in 0..THREADS {
            s.spawn(|| {
                for step in 0..N {
                    let mut ctx = OpContext::new(n, inputs.to_vec(), rm, DEVICE, step as i64);
                    kernel.compute(&mut ctx).unwrap();
                }
            });
        }
    });
}

#[test]
fn locked_updates_from_two_threads_lose_nothing() {
    let rm = ResourceMgr::new();
    let c = reference(&rm, variable_v2("c", DType::Int64, &[2]));
    assign(&rm, &c, i64s(&[2], &[0, 0])).unwrap();
    let add = node("AssignAdd")
        .attr("use_locking", value::bool(true))
        .build();
    hammer(&add, &[c.clone(), i64s(&[2], &[1, 2])], &rm);
    let total = (THREADS * N) as i64;
    assert_exact(&c.deref().unwrap(), &[2], &[total, 2 * total]);

    // An optimizer update of the same variable from both threads, ref and resource form.
    let w = reference(&rm, variable_v2("w", DType::Double, &[1]));
    assign(&rm, &w, f64s(&[1], &[0.0])).unwrap();
    let inputs = [f64s(&[], &[1.0]), f64s(&[1], &[-1.0])];
    let locked = |op: &str| node(op).attr("use_locking", value::bool(true)).build();
    hammer(
        &locked("ApplyGradientDescent"),
        &[&[w.clone()][..], &inputs].concat(),
        &rm,
    );
    hammer(
        &locked("ResourceApplyGradientDescent"),
        &[&[handle("w")][..], &inputs].concat(),
        &rm,
    );
    assert_f64(&w.deref().unwrap(), &[1], &[(2 * THREADS * N) as f64], 0.0);
}

#[test]
fn lock_free_updates_run_concurrently_and_readers_see_whole_values() {
    let rm = ResourceMgr::new();
    let c = reference(&rm, variable_v2("c", DType::Int64, &[64]));
    assign(&rm, &c, i64s(&[64], &[0; 64])).unwrap();
    let add = node("AssignAdd")
        .attr("use_locking", value::bool(false))
        .build();
    let done = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        // A reader: every snapshot is one whole value (all elements alike), never half an
        // update.
        s.spawn(|| {
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                let v = c.deref().unwrap();
                let v = v.values::<i64>().unwrap();
                assert!(v.iter().all(|&x| x == v[0]), "a torn read: {v:?}");
            }
        });
        hammer(&add, &[c.clone(), i64s(&[64], &[1; 64])], &rm);
        done.store(true, std::sync::atomic::Ordering::Relaxed);
    });
    // Lock-free updates may overwrite one another (Hogwild), never more than were applied.
    let v = c.deref().unwrap().values::<i64>().unwrap()[0];
    assert!(
        (N as i64..=(THREADS * N) as i64).contains(&v),
        "{v} after {THREADS} x {N} increments"
    );
}

#[test]
fn every_update_writes_in_place_when_no_snapshot_shares_the_value() {
    for use_locking in [true, false] {
        update_in_place_unless_shared(use_locking);
    }
}

/// An ApplyGradientDescent with `use_locking` updates the variable's own buffer while nobody
/// else holds it (without the lock too: copying first would cost more than the update), and a
/// new one once a reader holds a snapshot.
fn update_in_place_unless_shared(use_locking: bool) {
    let rm = ResourceMgr::new();
    let w = reference(&rm, variable_v2("w", DType::Float, &[4]));
    assign(&rm, &w, f32s(&[4], &[1.0; 4])).unwrap();
    let (var, _) = w.referenced().unwrap();
    let address = || var.read().as_ref().unwrap().bytes().unwrap().as_ptr() as usize;
    let sgd = node("ApplyGradientDescent")
        .attr("use_locking", value::bool(use_locking))
        .build();
    let step = || {
        run_with(
            &sgd,
            vec![w.clone(), f32s(&[], &[0.5]), f32s(&[4], &[1.0; 4])],
            &rm,
        )
        .unwrap()
    };
    // The first update may copy the assigned buffer (the Assign's input shared it); from then
    // on the variable's own buffer is updated where it lies.
    step();
    let before = address();
    step();
    step();
    assert_eq!(
        address(),
        before,
        "use_locking={use_locking}: updated in place"
    );
    assert_f32(&w.deref().unwrap(), &[4], &[-0.5; 4], 0.0);
    // A snapshot held by a reader keeps its values; the update writes a new buffer.
    let snapshot = w.deref().unwrap();
    step();
    assert_f32(&snapshot, &[4], &[-0.5; 4], 0.0);
    assert_f32(&w.deref().unwrap(), &[4], &[-1.0; 4], 0.0);
}

// ---------------------------------------------------------------------------------------------
// Graph construction: signatures and shape functions
// ---------------------------------------------------------------------------------------------

#[test]
fn shape_functions_check_reference_graphs_as_they_are_built() {
    let mut g = Graph::new();
    let var = |g: &mut Graph, name: &str, dims: &[usize]| {
        g.add1(
            NodeSpec::new("VariableV2")
                .name(name)
                .attr("dtype", value::dtype(DType::Float))
                .attr(
                    "shape",
                    value::shape(&PartialShape::from(Shape::new(dims.to_vec()))),
                ),
        )
        .unwrap()
    };
    let w = var(&mut g, "w", &[3]);
    assert_eq!(w.shape, PartialShape::new(vec![Some(3)]));
    let accum = var(&mut g, "accum", &[3]);
    let lr = g.scalar("lr", DType::Float, 0.1).unwrap();
    let grad = g
        .placeholder("grad", DType::Float, PartialShape::new(vec![Some(3)]))
        .unwrap();
    let out = g
        .add1(
            NodeSpec::new("ApplyAdagrad")
                .input(&w)
                .input(&accum)
                .input(&lr)
                .input(&grad),
        )
        .unwrap();
    assert_eq!(
        out.shape,
        PartialShape::new(vec![Some(3)]),
        "the var's shape"
    );
    let bad = g
        .placeholder("bad", DType::Float, PartialShape::new(vec![Some(4)]))
        .unwrap();
    let err = g
        .add1(
            NodeSpec::new("ApplyAdagrad")
                .input(&w)
                .input(&accum)
                .input(&lr)
                .input(&bad),
        )
        .unwrap_err();
    assert!(err.message().contains("var and grad"), "{err}");
    let err = g
        .add1(
            NodeSpec::new("ApplyAdagrad")
                .input(&w)
                .input(&accum)
                .input(&grad)
                .input(&grad),
        )
        .unwrap_err();
    assert!(err.message().contains("lr is not a scalar"), "{err}");
    let two = g
        .placeholder("two", DType::Float, PartialShape::new(vec![Some(2)]))
        .unwrap();
    let err = g
        .add1(NodeSpec::new("Assign").input(&w).input(&two))
        .unwrap_err();
    assert!(
        err.message().contains("lhs shape= [3] rhs shape= [2]"),
        "{err}"
    );
    let reshaped = g
        .add1(
            NodeSpec::new("Assign")
                .input(&w)
                .input(&two)
                .attr("validate_shape", value::bool(false)),
        )
        .unwrap();
    assert_eq!(reshaped.shape, PartialShape::new(vec![Some(2)]));
    let m = var(&mut g, "m", &[4, 2]);
    let idx = g.const_vec_i32("idx", &[0, 3, 1]).unwrap();
    let rows = g
        .placeholder(
            "rows",
            DType::Float,
            PartialShape::new(vec![Some(3), Some(2)]),
        )
        .unwrap();
    let scattered = g
        .add1(
            NodeSpec::new("ScatterAdd")
                .input(&m)
                .input(&idx)
                .input(&rows),
        )
        .unwrap();
    assert_eq!(scattered.shape, PartialShape::new(vec![Some(4), Some(2)]));
    let err = g
        .add1(
            NodeSpec::new("ScatterAdd")
                .input(&m)
                .input(&idx)
                .input(&two),
        )
        .unwrap_err();
    assert!(
        err.message()
            .contains("indices.shape + ref.shape[1:] = [3,2]"),
        "{err}"
    );
}
