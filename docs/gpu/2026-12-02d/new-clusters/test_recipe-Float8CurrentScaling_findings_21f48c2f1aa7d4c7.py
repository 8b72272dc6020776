"""gradfuzz case /root/out/work/export/recipe-Float8CurrentScaling_findings_21f48c2f1aa7d4c7.json (te, bfloat16, input [16, 16]): ScaledSReLU -> MakeExtraOutput -> AddExtraInput -> GroupedLinear.

Reproduce: gradfuzz replay /root/out/work/export/recipe-Float8CurrentScaling_findings_21f48c2f1aa7d4c7.json --backend te
Expected: outputs and gradients within gradfuzz's bounds of the float64 reference, no caller tensor changed.
Quantized by recipe Float8CurrentScaling (HYBRID): the expected values (EXPECTED) are gradfuzz's float64 reference with TE's quantize-dequantize (ops/quantization.cc)."""
import base64
import os

os.environ.setdefault("NVIDIA_TF32_OVERRIDE", "0")  # fp32 GEMMs in fp32

import pytest  # noqa: E402
import torch  # noqa: E402
import transformer_engine.pytorch as te  # noqa: E402
from transformer_engine.pytorch.ops.fuser import OperationFuser  # noqa: E402
from transformer_engine.common import recipe  # noqa: E402

DTYPE, DEVICE = torch.bfloat16, torch.device("cuda")


def unpack(data, dtype, shape):
    t = torch.frombuffer(bytearray(base64.b64decode(data)), dtype=getattr(torch, dtype))
    return t.reshape(shape).double() if t.is_floating_point() else t.reshape(shape)


# The values gradfuzz drew, float64 on the CPU, rounded to the case dtype
X = unpack("6r86P3G+p78DvwTACcCQv5S+o7/nvxxAyj90vuU+OECdPgNAqT4+vwvALj8gvoW/gz+Lv3k/3T+9vxRAjj+HPze++z6Svg9ABj+nPvC+kr/cvt8/GL/zPfg/0T6mP5S/wT+ZP5+/mT+fvqs+DcBOPgM/UL/Jvze/PUDgP9M/er8vP3i/Lr4nv1i/Sj+/P68/Ob4XPyi/cb+LvzW+278Ev5++5j8hQJC/gj/pPds/hb+wvo0/078XQKm+kr7OvmM/aL9VP+g/Kr9KP6C/Gb/6vm+/Z76kP4c+HT+bv9i+nL8VvjNA5T+QPiK+fD4PwFm/D780PlU/379nPko/HcCFv86+Yz+pvzU/UD4Nvwo+zr5wv52+yD70v3e/N7+pv1C/vD+2Pk+/7D/wvpo/gT4tv3o/rD/Gv4o/vD8wvyy/xT4lv6a/Vr+Ev98+HL6Zvxw+qr9Bvks/uj/yvtU/A0DfPt8+HD95P4e/ZD8kPxU/mz7ivrM+gz/aP7k+SL6pPg4/qj+kv8W/mL++vou/h77kvoE+ar6WPwS/LkB5vt8/nr5Uv5o/7b71Pso+hr5jPwI+kj9CP5k/HT8ev9A/gz8Avgo/Tb9Gvzo+kT6svzC+er+OP1k+ab8zPpO/zT8av3S/3T6wPrS+ub+jvvO/q7+fvuC/WT8eQF6/gL+zPxRAjD4=", "bfloat16", [16, 16])
W3 = unpack("oz4NPmM+lT6+PnO+h77EPpA+V76FvYC9mz4Wv06+Kj7Qvna+ZT7FvmC+1LtEvs28Ob0AvuO9YD4rvwC+tr3YPrc+9j12Pbg8TL6tPhM+fD6lPoU9gT62vHu+0b7lPRg9Dz6LvOa9lr6YPga+4zx3PjK+D76aPlG+/D2avfk+ojyNPvy+Ib4qvTa+3b2TvhE+Hr5Uvs097L7uvdY+Pj29Ph8+m74xvsG+jD6fugi+vzs/PoY9pT6uvtK9YD43Phk+/z0uP4s+gz0xPps9uz7qPVu+jj6Pvdk+67woPk49Zz41vrU9mT2Ovl89Mb6pvk89PT0TPnI+fL49vns85z3jvXg+Cj1IvrY+B70dvie+gz3Yvic82b63vh4+6D7Vvuy8Xj1NPD09fr5RvhQ+oL5WPaY+eL6JPtG9A778vnS+h76GOic+Y766PhO+iL0qPZ47XL4ovvS+3j5EvrI+e73JvHq+tj0aPVk+b74fPmO9qj7cPV4+c73vPE+99z2PvLc9bj79PGi99rz8vRa+tz5AvV4+JT64OrA95D03viA+FT5iPo8+T7xwPpO+072pPgI+Q708Pfu9Gb1FPkQ95L0LPxe+w72VPgS++z1dPqM8yb7YvrA+Ub6pPQs8nb3WvfM8xz1EPjo+7D2JPUY+776ivl2+wr7iPYM+5Du9vr0+EL4=", "bfloat16", [1, 16, 16])
B3 = unpack("9L0Cvoq+Zz4zPx8/bD4bPnY+Lj6wvcC9pb7FPZo9OL4=", "bfloat16", [1, 16])
E0 = unpack("D79Yvty//z6oP9Y+n7/jPsA/JD9KvsI/gL4Svyu/LD8=", "bfloat16", [16])
E1 = torch.tensor([16])
DY = unpack("kr8GvzA/k7+QP+A91b4hP2m+vD/gvuU/gL9rvQFAxT+bv8C+yL/2vtG+R7+Zvyu+6T3OPtm+Vz7wvvw+4L8KQKE/Jr+2v4m+jr+1PVy+rr7pPwA+kb64PkA8Hb+WP4m/PL67P8M9cz8WPrC/j7/PP2g++z2Rv6K+i74+P1w+Qr4eP4e+cj+lv5M/Cb9rv8y/o72HPaE+rT+kv4m/Gj9DvzPA4ztJwMq/KkABvxU9ub5yPYI/6D+uP82+ZD+IPyo8lr9avtC9zb+EP2A9H7/FPuS/sD5ZP8++tr9Dvrk/eT8Nv3u/aj8lPyM/l7+qvl6/S7/vPma/pb6Av6y9IsDhv1a/3j5FP64+9j9EPwY/kL77Pw2+L78VwIk/oj+tPoM+or8iPt2+cL78vPa/hb+oPKu9Ib+rv7c/kb8uPsu9ET9RP0M+m7+Gv8Y/Sr83v74/Mb/JPyW/uT2IPkA/2L8IQJG/Nz4qv1g/fD+Uv/2/hD9zv9o+a76dv8E/xL8QP9I+9D+5PsM/RD91P5U+H8DVvHE+6r4KP1o/Fb8zP4m9cz+ZPhm/Iz9ov8k/cz/hvtY9lj9Evse/Dr8Tv7Q/hT8nP5k9EMDdvTK/Cb8pQBc/UD9Tvoc/+j7KPQE9VMC8P1a/Sb4SP4s/hz+JPydAsD+tP+o+pr+hvzm/Ez6hvzO/Xb8=", "bfloat16", [16, 16])
RECIPE = recipe.Float8CurrentScaling(fp8_format=recipe.Format.HYBRID, use_power_2_scales=False, backward_override='high_precision')
FALLBACK = (1e-05, 0.032)  # atol, rtol of the tensors BOUNDS does not name
BOUNDS = {  # tensor: atol, rtol, per-element allowance, norm bound
    'grad_extra_input[0]': (1e-05, 0.0078125, unpack("ADVCzUC+CkAABfGAYdkCQADL04CJWgVAALWSipQ+A0AAtXla9fABQABqAmKPoA1AAGpwpjew/z8AtT7G+3UDQABq2sySIP8/APWjvQIvAEAAtfO8blIAQACdvJsBqAJAAEUqSnPkA0AA9ZggzqsEQAANRzUvJAFAAPUl6xyKCUA=", "float64", [16]), 2.160019988754921),
    'grad_input': (1e-05, 0.0078125, unpack("AAAAAIgI9j8AAACO8hz3PwAAAACICPY/AAAAAIgI9j8AAAAAiAj2PwAAAACICPY/AAAAAIgI9j8AAAAAiAj2PwAAAACICPY/AAAAAIgI9j8AAAAAiAj2PwAAoNwlOPk/AAAAZi1V9z8AAAAAiAj2PwAAGNVQvvc/AAAA0lqo+D8AALsv3DH2PwAAAJZBwvY/AAAQw7NK9j8AAAAAiAj2PwAAAACICPY/AAAsKkld9j8AAAAAiAj2PwAAAACICPY/AAAgYqMw9j8AAAAAiAj2PwAAcN0gGvY/AADw2jrL9j8AAAAAiAj2PwAAwKHJKfc/AACgu2a09j8AAEBOOI72PwAAAACICPY/AADgBUkL9z8AAAAAiAj2PwAAABDBkABAAAAAXl3p+D8AgAVugoD3PwAAAACICPY/AAAAAIgI9j8AAAAAiAj2PwAAAKL9xv8/AAAAAIgI9j8AAGDLEsH2PwAAAACICAZAAABg/CNV+T8AAADCLQYEQAAAAACICPY/AADkZs/P9z8AAO8U0973PwAAAACICPY/AAAgabPB9z8AAAAAiAj2PwAAAPa/c/Y/AAAAAIgI9j8AAF6GNyf2PwAA0MkoKfY/AAAAAIgI9j8AAAAAiAj2PwAAAACICPY/AACAfcit/D8AAADWADD3PwAAaESNVvc/AAAAAIgI9j8AAHB3ID35PwAAAACICPY/AAAAAIgI9j8AAAAAiAj2PwAAAACICPY/AADgSq5r+j8AAABiiBb7PwAAAOkOYvo/AAAAAIgI9j8AABD6BA73PwAAAACICPY/AAAAAIgI9j8AAAAAiAj2PwAAAACICPY/AAAAAIgI9j8AAAAAiAj2PwAAAACICPY/AAC4Gt86+j8AAMwlCGr4PwAAAACICPY/AAA4jvam+D8AVCX3nB/2PwAA+Fz6tfk/AAAAAIgI9j8AAAAAiAj2PwAAIgiCofc/AAAAAIgI9j8AAKDCryT4PwAAAACICPY/AAAAAIgI9j8AAAAAiAj2PwAAkDgJT/g/AAAAAIgI9j8AAAD6FTX4PwAAQN6/yvk/AAAAAIgI9j8AAMDOA9/3PwAAAACICPY/AAAAAIgI9j8AAAAAiAj2PwAAAACICPY/AAAAAIgI9j8AAACGY0r2PwAA8Hlgvvc/AAAApaAO9j8AAAAAiAj2PwAAAACICPY/AAAAAIgI9j8AAAAAiAj2PwAAiNlLmfY/AAAcBSDA9z8AAADtIav2PwAAAACICPY/AABzy1c99j8AAAAAiAj2PwAAAACICPY/AAAAAIgI9j8AALRIC172PwAAyBvvkfY/AAAAAIgI9j8AAJhViYX2PwAA8J1TOPc/AAAAAIgI9j8AAAAAiAj2PwAAAACICPY/AAAAWYpR+z8AAAAAiAj2PwAAAMArm/Y/AAAAwLnK9j8AAAAAiAj2PwAAAHIG9PY/AAAAAIgI9j8AAAAAiAj2PwAAAACICPY/AAAAoDPr9z8AAAAAiAj2PwAAAACICPY/AAAAAIgI9j8AAAAAiAj2PwAAAACICPY/AACAIrXD/D8AAOAjzEj2PwAAAACICPY/AAAAr/Ky9j8AAAAAiAj2PwAAwOY/bPg/AAA8tY+A9j8AAAAAiAj2PwAAQMM+e/c/AADgGOtK9z8AAAAAiAj2PwAAgJPbDPg/AAAgnvn79j8AAAAAiAj2PwAAAACICPY/AAD8Iy2z9j8AAAAAiAj2PwAAAACICPY/AAAAAIgI9j8AAAAAiAj2PwAA1Ds4S/Y/AAAAAIgI9j8AAAAAiAj2PwAA8iNiKvY/AAAAAIgI9j8AAAAAiAj2PwAAPqegZfY/AABk8vi/9j8AAAAAiAj2PwAAWFUxSPc/AADkPS579z8AABbtKjj2PwAAAZMNQfY/AABATLJOAUAAAIAuMpf5PwAAAACICPY/AAAAeNmx+T8AAECdzUD3PwAAQPim1vg/AADcpa1F9z8AAAAAiAj2PwAA8PLM/fY/AAAAP80M+z8AAAA+7sD8PwAAoA8iQPc/AAAAAIgI9j8AAHA9rY/2PwAAoBjEpPg/AAAA8G2S9z8AAAAAiAj2PwAAAACICPY/AAAAAIgI9j8AAAAAiAj2PwAAAACICPY/AAAAAIgI9j8AAAAAiAj2PwAA4ElsMfY/AAAAAIgI9j8AAACQsjn2PwAAAACICPY/AAAADsyc9j8AAAAAiAj2PwAAAHX94fY/AAAAAIgI9j8AAAAAiAj2PwAAQIpgifs/AAAAAIgI9j8AAEAwNDz3PwAAEO2igvY/AAAAAIgI9j8AAECPrlv3PwAABJTfKvY/AADAEvBs+D8AAACRQ/L2PwAAYLGtN/s/AAAAsX1l9j8AAAAAiAj2PwAAgMHIIfc/AADADmkb+T8AAAAAiAj2PwAA5EmR7/Y/AAAAAIgI9j8AAAAAiAj2PwAALbmxhvY/AABkr/VU9z8AAAAAiAj2PwAAAACICPY/AAAAAIgI9j8AAEAH4YH2PwCAuzjUa/Y/AAAAAIgI9j8AAGYQcTT2PwAAAACICPY/AADQHKEJ+T8AAAAAiAj2PwAAAACICPY/AABoRk++9z8AAIBDmT74PwAAAACICPY/AAAAAIgI9j8AAAAAiAj2PwAAAACICPY/AAAAAIgI9j8AAAAAiAj2PwAAAACICPY/AADgh2ya9j8AAMA/l57+PwAAAACICPY/AAAAAIgI9j8AAIC9ie37PwAAAKQARvw/AACAMFdY9j8=", "float64", [16, 16]), 1.7064444677083095),
    'grad_param[3].GroupedLinear[0]': (1e-05, 0.0078125, unpack("AADVRX3ZBkAAAHUIyWwEQAAA9apL5AxAAAApcSUsDUAAAFk3NDAHQAAAzTgEbgRAAAD1ux9aBkAAAAX/DXgFQAAAtcIGggRAAAC4aMWpBUAAAHUyuc4GQAAAdYnUGRRAAADROq/OCEAAADV0ZMEFQAAA9YAE3AZAAAAlHMDDDEAAAJWFgeYEQAAAZbY9JwhAAADlVO0+BUAAADWR/i0NQAAAycNhYwRAAMRY9dVnBEAAABldD7AEQAAApUrN3ARAAAD175tABEAAADmRhQIFQAAAJcGKGAZAAACF5DXZBEAAANHTD/8JQAAANWbVWQhAAABVMBCfCkAAACIYXlgIQAAA1SrNYARAAADVlu7hCUAAAHWvGJYKQAAAOZkZbg5AAABRMYzCBkAAAIfe3UkFQAAAtZHNFwhAAAAPPVBaB0AAAE2VQkoEQAAApMlDsQdAAAB1GngaCUAAAFbulkUSQAAAbacCFQxAAAC1+6FAB0AAABXHj6INQAAA1bm/rwdAAAC181x/BEAAAPXCLNkHQAAAtVJNtAtAAAA1oxu9BUAAAPWhK00GQAAAzYFDwAVAAAB1670tCkAAAKXoAMUFQAAANXiyUARAAABlV5W/BEAAALVjhsIIQAAA3f8zKApAAADxQoXEDUAAAPW/GyMJQAAAtS9cfwxAAICa5tIWEUAAAFV3MT0EQAAAtS6muwpAAICKhLL1EEAAABWAsUkKQAAA1TKBnQdAAACNq4kTBkAAAOWk7mYNQAAAHQel3QVAAAAVPK7pBEAAAE0yFLcGQAAAtVqx5gpAAICupt6eE0AAAFnr/LAKQAAAdRo0IgZAAAD1aT3PCUAAACWHWB0NQAAAtQiNCAZAAAAVwk7SB0AAALU6tbgIQAAANffr7wpAAADVkGagBkAAAF95vWQFQAAAdarXMAdAAAC19dnpBUAAAHVxlTsEQAAAlZC3WgZAAAB1vmb0DEAAAN++G4kMQAAAHZAsxglAAADVseVKC0AAAPWILrYLQAAAFSle0gRAAAD1NYg2BEAAAPWu4k4HQAAAdbtKRgdAAAD1clkaCEAAAOWxP0wJQAAgfs/J8QVAAADVdvkmBkAAALWEuXQHQAAA9T1XfARAAAAtdOq3BUAAAHVkAL0HQAAAHarnvghAAAAx3XPADkAAAHUEwU4FQAAApUR21wxAAACdBXcQB0AAAGVDX+QEQAAAdVNVhglAAADlLTorB0AAACV0Wb8GQAAA9VeBJgZAAACS86E9BkAAAFUzdTwMQAAAhVyXEAdAAAA16luOBEAAAHURn2cGQAAAtYMV7glAAACFJu6BBUAAgIaZFiARQAAAdb5uPwdAAACVuUxuD0AAAFXnR5QGQAAAnXsPewRAAAA134EPB0AAAF17ae8LQACAHht45RNAAABNyqLZBkAAQOTZPgIFQAAABWzrVgRAAABV7i6cBEAAAHUWpQoFQAAAs7uayAxAAAAVek2ABUAAAEejtF8GQAAAue5oMQtAAAD17vsKB0AAAG10/hUIQAAAReW2uAVAAABVLHHABEAAANUCyEEFQAAANUh6CwhAAAAV/1/EBUAAAFUdkUQFQAAAJ6hlewRAAAD1+pQrBUAAAB+qBn4EQAAA3R64tgRAAADFK0INBUAAAJUue0kIQAAAxS+ztglAAAA7hVdOBEAAAPW0UKsEQAAAVdZEBwpAAIDKCAPIEUAAAHUs3DMGQAAA9S++OApAAACVRmiHCEAAABV4uooIQAAAxW2WLwVAAAB1cYEtBUAAAPWXtcwHQAAA9TAfjQRAAAD1nuOgBEAAAB2cpQIJQAAAtdDiIwlAAAD1li+rCkAAAB2LrgcNQAAA9V2f5QZAAADVaMLSC0AAAAUsV7cIQAAAxd+luAVAAAD1WWSvCkAAACXKxj8FQAAAbVgGAwpAAACn0AQ4BkAAAF2CxiEHQAAAdXieEg9AAACdNn2ACEAAALWc50EEQAAAY+lvEQhAAACtxjNhBkAAgJlxbU0QQAAAs59SuAtAAADV/7bjBEAAALXYcJQIQAAA7xGJew9AAAC1EvPUBEAAAPW9UsoEQAAAdduxtwtAAAAvlgJ6B0AAAB8AJ5oJQAAAfAt7mgVAAAB1QG8ACkAAAN3vi9EHQAAAlaIkTwRAAIA3ipl8BkAAAHWAaigGQACAs0DvGwlAAAB1CkUHBkAAABUmpF4FQAAA9TokXARAAAB1I3M6DEAAAPUtE6cFQAAAVZaRRgVAAAB1MEPWBUAAAHULEJwIQAAAdfrQGAdAAABdpwb7BUAAADWlMygHQAAAVUV0nAdAAAD1mKLCBUAAANWrJZ8HQAAAVRTfRgtAAAD1Ib6DCUAAABPU73UKQAAA9XrYWgdAAAB7eAPBBUAAALUxXccEQAAA9QR+iwRAAAC1VevzDUAAAHXxT7YKQAAA9SIKfAxAAAB1KZQ+B0AAAAUql7EEQAAApbMXrwZAAACFcjFUBUAAALWbxFMEQAAAtUbHqQhAAAB1Z50sB0AAAHWPGn4JQAAA1c99lgxAAAB1/V3jB0AAAPWD3EgHQAAAJQdJGw5AAAD1cR/wBEAAALXGqCYMQAAAtQm3AAdAAAB1aOBpCEAAAHWOp+QFQABwPF20VQVAAADlZ/QjCEAAAC0SaYIFQAAAVawmpwRAAAD1guP5B0AAAPVfpvIIQAAAhYFkCwhAAABdgnF1C0AAAHU9trYIQAAAtWkzawZAAAD5uNVeCkA=", "float64", [1, 16, 16]), 6.61253643467725),
    'grad_param[3].GroupedLinear[1]': (1e-05, 0.0078125, unpack("AAAAAACA3D8AAAAAAEzYPwAAAAAAQN8/AAAAAABg4D8AAAAAAMDjPwAAAAAAAOI/AAAAAAAg1z8AAAAAAPDcPwAAAAAAQNg/AAAAAADA1j8AAAAAAKDgPwAAAAAAgNs/AAAAAAAg2D8AAAAAAKDWPwAAAAAAwNc/AAAAAAA44T8=", "float64", [1, 16]), 0.4805632253016821),
    'output': (1e-05, 0.0078125, unpack("Jjprs3N3IEDuyritKAAhQPvm9YWwWyBACx3xrHBFIEBBIre5AmcgQLzJhTjmRyBASH1pimbiIEDkk0N4OakgQFCQu5pyqiBAvBxmt2+VIECcos0tDJggQGytizITRiBAso0sQquDIEAsN2cUBcEgQHMgY1LOUCBAzsr+gW1SIED6QRaqaqkhQDRtJcZM3CBASI2xgPM9IUCyl6DmfXUgQFiWIZnWTSJA+zbqVqqLIUBQGrf2FeohQFi4j5RuiyBA3QeR3+vlIEBCwftQVQIhQJoLFu39XiBAM9HKV9eLIEBiJ8zF4o8gQMJqSP8bAiFA7No4+InMIECLSLGVQcAhQFgrVjIpZCZAEPdyV5EwMECaGuKS1kwkQEyQR8wL2CZAKB4l51p8JkDwDflO+78jQJAX7Ufq3SRADIPaBqv2JEDw9J6ixRokQEBgWKpg+iVAjJhthLoLJ0DAK/o3mmwjQIz67j43+yRARH9FRJIPJECc9UpgLxEnQLVRBL8STydATOcBBeFoIEAQCQodvu8gQHjZOeZahiBAJHAkRBeNIEAIQwy26TkgQETQiUJoQSBAYPnbupZsIEDHJEmLSn0gQKivekyhdyBA4GU44By+IEBehjKhskogQCb06AGaSiBA9XEkzoZeIEAcb7F1oHQgQD4BU8VqTyBAeBoDz3pVIECytdHbY58iQDDklxd83yFAPPC38QgjIUA6EzD0oF4gQL5hQa6v0CJAJEkDgTB2IUD0q4wg5DMjQEhrCR4oFSNAd1DLzr+qIUCCp7Rn2AwjQBayxsCUmiBA9sBk+vfTIEDQqtP0GE4jQNK5nRU/9yJAs5c9mhd9IEBA/wRQN2AkQOZH4LnchyBAh05t/kveIECXKjCKzlggQGuCZnZBXiBAuI7RY4sGIUDOouBiw5AgQER4EADOUyFAgfLFosxxIEAOPmpwm5ogQIQTxvCRmCBApr3sKyFoIEBx6N5u4F8gQNugAMsXayBAW2nDNmQWIUBSowo+s4MgQFQXs1enMSBAUondQbhKIkBHlJ5IT9UhQKrdV97mCSJAOEDIvUaHIEBA5SrXlIchQArJZ790aSBAPEROms2tIkBz742CdkgiQGJRvtiuYiRAFV6TZDYAIkDQBbqxn8wkQAAc7uUoOiBAPZ9gqVLAIEA6r9+ZR+YgQPVn6pDnKyJAzA6hEWpuIkCUQEq/tncgQIwGjqObeSBAgYVlRqNSIEAS9hK/80QgQK7vcjuIcyBA1kaz8LZQIECcJDtnq3QhQPZAliArZCBArMpsKE91IEAKlkLGEHUgQEJbsV6NaSBAayZ6/0xhIEA4phKwDkwgQPyoYkw7kSBARhFPISNBIEBgm8/oTGEgQLg/UHUPSSBA85HsDnVSIECAodGmfEMgQMKQeosAPyBAo5Mj/od2IEBmF+Z+IlIgQDm1FjhofiBAXjjhq0M9IEB+TfOBT0YgQIMCcj8sQiBAwEZCXg9IIEDahies4UIgQBxDq5cBPiBAWUIopKtUIECrnqMaBkEgQC5Hok/JRyBARr0zc3ahIED8xyjdILYgQO6lYImzdyBAWFBYxQBjIEBA7aTj+GYgQHEjWjZ0YiBApGVyvkCIIED8+EaDTaUgQFMUHQyPWyBAiLBYbN5fIECKB3dLhm0gQDzpHgdyVCBAPxiX8vRVIECcHkPXvJcgQPuaPDa2RCBADk5WdZlKIECYcUw7eUQgQB4rB9LZPSBAHg8CyMs0IEAzlSDxolEgQBfp04h5USBAhMi0smc5IEA4Gv2HLVIgQFPCgVWlMyBAPuzVsZ9IIEB4GGDz71YgQN6bhMOlQiBADcHFJ0o5IEAZDXVYbTogQI6/yQhBQCBAxnQFesM4IEALQIAydEcgQGhP1cJAOiFAiB3Z/NZ+I0B64e1Z8oQgQE3N0655qyJAEIW6KIj7JUDltnoWE1kkQEjLZUikViZAo1px1WVqIkAI3d3ti/8kQKA9rTPmCiFATubjWZSbI0C6U+Tg78MgQNz07AR62yBAWk+V4PyaIEDx1YHjqI8iQHCit/WiyCNAhUBR/27GIECEFp761BIhQN7BZL+vtiBAoYMTu1WFIEAR66B0fYsgQIb9HB1FZSBA8N5oQ3NVIEDWVSk6hH8gQAEgK+zajSBAUn5d4gxSIEAxBP5lcFMgQBB9huSzjSBAbPBKqTyWIEA3wKNS3I8gQLh0YksZdSBADoF7bv1qIEB2hpPOBIggQABlBYmuYCBAGA3aKYZdIEBofxCTx0chQGGdvkqlXyBAQrCZhE6cIEAwaCqClUwgQOPLvu3wYiBA25Nei2QNIUDgt8MrRaIgQOSukexbXSBAciUA8R1cIEDudR8qFYYgQNpiaYc9hyBAEVh2PKdLIEBmRsBcnzMhQFifmPFxXCBAZzehBEhLIEAI+Pp69UggQHZtqebQRyBAhI5ojapoIEABgDArTU0gQIBCybNBOyBAv9JFZ1Y5IEDQORjjIFIgQDoSesplbSBAwOO5TItLIEBck7lTlUwgQCSgCt1sOSBAoDOk70M0IECX/0o2m3AgQCkbIUjsgyBAyH/bagyTI0AuA7md0MEhQMG0agMOuSBAZAyQXhZHI0BGrJifFIkjQDzn0JE+wSRAlTa68HmbIECeX+HHSuUiQHh+Yph12yJANJi14k6TIEAg8ZhmYawjQLmbYCo4eyBA/DFPPQ0HIUBVVAXT4UshQIpJZ798MSNAkn9AQcJ4IEA=", "float64", [16, 16]), 8.813801827963918),
}
EXPECTED = [  # per call: tensor -> the float64 FP8 reference's value
    {
        'grad_extra_input[0]': unpack("AARx5LePNcAAYCBgzO3Ov6i1wPjW5TNAAEZmM7lRO8AAAPFSW3HEPyz7O+G+pDfAAABI7l6BrT8AFFZf0nokwAAAW20AEP2/ACzKsOvVEMAAlF84EYwiwIC2q557HRzAAG9tRr2uGUAAhAaZR+IUwIBdRHg+xRBAgLaLVYyqR0A=", "float64", [16]),
        'grad_input': unpack("AAAAAAAAAAAAAIBc5ZruPwAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAyt35MgNAAABgVsq0CEAAAAAAAAAAAAAAGNXIZcE/AABwaQGLEUAAAEXQq7bIPwAAALDMDZi/AAAQwyviwj8AAAAAAAAAAAAAAAAAAAAAAABgUQmGkz8AAAAAAAAAAAAAAAAAAAAAAADgneTXyT8AAAAAAAAAAAAAIEXOvLi/AAB4bVnh0r8AAAAAAAAAAAAAQF6+/sC/AAAwohCq1b8AAMgJttDwPwAAAAAAAAAAAAAg+j79zL8AAAAAAAAAAAAAgBeccyzAAADgVQ2OD8AAsMBN/473PwAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAiNb5xiLAAAAAAAAAAAAAAFCausPePwAAABARDDTAAAB0gGzW878AAPCx8PcvQAAAAAAAAAAAAMCRiYuDBcAA4J1iyTr7vwAAAAAAAAAAAABuSW3EBsAAAAAAAAAAAAAAAPubVdO/AAAAAAAAAAAAAHgZvpqlPwAAMDZfH8u/AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAADsAyrVEMAAAKByiE0HwAAAABpRgWM/AAAAAAAAAAAAANwdJq3kvwAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAACuZDJmDkAAAPD8j5cSwAAAkG6YpQ1AAAAAAAAAAAAAAPiCQR3dvwAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAIBUjtr8D8AAYC4BDFMQwAAAAAAAAAAAAMBxdPMUEMAAAKs2whpnPwAAYbRRCva/AAAAAAAAAAAAAAAAAAAAAAAARBD08b8/AAAAAAAAAAAAAFT4hKP1PwAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA3LFfzuw/AAAAAAAAAAAAANBvZLEQQAAAHILcgwzAAAAAAAAAAAAAAOy8Z90EQAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAIAeiS/uvwAAhOGJ8u2/AABQimFADUAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAMXsYcvu/AECuf4aECsAAAADQnomMPwAAAAAAAAAAAADMLT9Tqb8AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAEy3fCrJvwAAhxzT7v4/AAAAAAAAAAAAAJhVAb3EPwAAwHcun60/AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAADIEkiqEcAAAAAAAAAAAAAAADwqSQHAAAAAIOf+2r8AAAAAAAAAAAAAAMdAqtQ/AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAQFcFuD8AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAADslibqGMAAAPARIsDTvwAAAAAAAAAAAAAgqrKq/D8AAAAAAAAAAAAAKAOJc/w/AABiJfyj0b8AAAAAAAAAAAAAmCepMfq/AACQc86+1j8AAAAAAAAAAAAAAE5Osai/AADAwxyZt78AAAAAAAAAAAAAAAAAAAAAAAABt1aV4L8AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAFuKnXtM/AAAAAAAAAAAAAAAAAAAAAAAA4MBdQom/AAAAAAAAAAAAAAAAAAAAAACAzylGN+a/AACZPNyt6D8AAAAAAAAAAAAAVdUK2P8/AAAcwlkNxr8AAACLdktYvwDwz6Z3fAHAAABiclNSIMAAAOii6tgBwAAAAAAAAAAAAAAA0dWq9L8AAKizCIf0vwAAfBAeEw7AAECipS0MBsAAAAAAAAAAAAAAXp6onvm/AAAI1t13GkAAAPAxw/UcwAAA9EHz5vK/AAAAAAAAAAAAACmsjbcDQAAAOx8e6xHAAAAAQsOO9r8AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA4EnkyMa/AAAAAAAAAAAAAABIlTjXvwAAAAAAAAAAAAAAOBARpr8AAAAAAAAAAAAAgEVFk9u/AAAAAAAAAAAAAAAAAAAAAAAApIgNmARAAAAAAAAAAAAAAMDPUwzKvwAAwEuUd6g/AAAAAAAAAAAAABgum9X7PwAACCivJLU/AACo/XKz9j8AAABvRNbCvwAAWGzJ6++/AADwpDBaCEAAAAAAAAAAAAAA0OfX3PW/AAAo3qM99j8AAAAAAAAAAAAAcNja468/AAAAAAAAAAAAAAAAAAAAAABAS26Kv+M/AIDstY0J+b8AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAHSQlecBwAAg0fEsJ+e/AAAAAAAAAAAAADOI9BXWPwAAAAAAAAAAAACaIyNA+78AAAAAAAAAAAAAAAAAAAAAAAAzF0cJ8D8AACCve3LuvwAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAEb8ON/j8AAAHDp70qQAAAAAAAAAAAAAAAAAAAAAAAABTy1/AUQAAAkOL1eCJAAADgMwxM5j8=", "float64", [16, 16]),
        'grad_param[3].GroupedLinear[0]': unpack("AAA6dAUUFsAAAPijl6InwAAA9Eas+SPAADBhvLa7PMAAwCEFmu4SwAAA6/WFagjAAAAoswREE8AAALIux4sFQAAAUI4M+vq/AAx9wz8mM8AAAOBqY0kFwAAs2q2YbzDAAHDFatOSOMAAALD646n2vwAARIDuiSrAAAAruZ6KH0AAAD4wNfMQQAAAeJa0FuC/AABwyxil3r8AAMKvXnctQAAAlU5jMvw/AOLxtQAn4D8AAC6W4pTovwAATDC+0PK/AABodmxCFUAAID6IRQcgQAAAhZwUIBpAAACxFfYrGEAAcCntlNc1QAAAGvn/3S9AAADJItYLKEAA0OqY6AMVQAAAqNdBrvK/AACofPkt/T8AANDeHQwuwADwwOuutjdAAIAEC+nKBcAAAImqBJjoPwAACCG/PwvAAKA5uwfUEUAAAOwFNxjkvwB4AXq73CdAAADwxvXPG0AAJLOaOt42wADA73DZnyRAAADcKJMNH0AAAO3ZRUwvQAAAg1mvXCDAAABAaogl0j8AADQ+BeIiQAAASsbT/CFAAACccTT6FkAAABDjagYOQAAA6kFk1vK/AADwtGBvI8AAAPPFshoYwAAAKEIkGQVAAAB8M3BJ9z8AAJc4Xc0zQABAs/tyECNAAODLhVWNKkAAALQ5SggrQAAAMj0sQyxAAAAeip5wJUAAAHg71+j9PwAA1nLxaixAAAADfHORJEAAgCWMQKc1QAAAajXFBxBAAABDpDbfDEAAgCQvl9UpQACA2gc9fBdAAABYkwnM9L8AwEb96VQvQAAA7DIyExZAAMDgueDmJ0AAIA9DuZQgQAAAgDfQm+I/AAAER6vNIUAAANs/ODAewAAABjyKsCTAAAA7LjyiJsAAAHb6CHsjwAAAkkRPSSbAAADsQNJwDcAAYAFxUesXwAAA8M2PDhrAAACIrQAaCMAAAMD48T4gwAAAjs/xWxTAAABYbiu5L0AAsFTGhfwtwACgGmCxVjTAAACGEhFTHcAAAPzP4nwsQAAADMzuyADAAAA4xTQ+FcAAAIAlDvXZvwAAgHPitPS/AACgxd4/+b8AAA5lTWYLwACSYFR/3RbAAAAqsS3fG8AAALRPrlUUwAAAIK2gWPS/AACQKtQDwL8AACih5kIlQADA+mbXOivAAABErGBZ1D8AAGCPnWYHQACA2Q3tRStAAACFT9SeBEAAAMKorkYDQAAAYPM3aRLAAABHWhYxEsAAAFWxp7UeQAAAoDMrQ/o/AIDxShnu778AALH66n4iwAAAMS1s7x3AAACgT7wF778AAABRuYkKQAAALvhdUSdAAABezPyyAEAAYKZimdgwQAAAYLlM2w5AAACBwaOaK0AAAN41p+cTwAAA2A3FPti/AACQqpSC/b8AQI+nrL4jQADgTJE7sTzAAADKbwxQ8b8A6A1KDV0BwAAAriNd+AHAAABwMi0h5b8AAMDcywP4vwD4yBi74jPAAAAKj2fWGUAA4GL+oRsawAAQlVFevDTAAABg2Umc/r8AgFBhPUAewAAA9Ja4h/Q/AABI11i2978AAGrIgC0QQAAAFKTlYBRAAACmSFeFE8AAAAjbUJXwPwAAp3A3T+O/AADQ8cddC0AAAKogMuTbPwAAU41jzALAAAC2S5KBBcAAANfKgr4kwAAAZerNORDAAGC8L0hDE8AAAFzhiwQhwAAAZ4JrjyfAAABBjLEbKsAAANCFX94bwAAAMMsiHAfAAACQ3smW4L8AACxC4zEKwAAAYDd8tMM/AAAAY4q9AcAAABjv0SQdQAAA4KnSfPc/AACAFQ830L8AAKpENHr6PwAAxo2vtynAAABs2IrUIUAAQA3QbicnwAAAcKWGZgPAAAD7bsc9IMAAACkq2IkTQAAANtUlrAlAAAAI/ViJF8AAAAskXzIYQAAA3zkmHQ7AAIDMEYwn+78AAOPAAf8IQAAAiLA56CRAAIDSimomGUAAAGhiAqUBQACABCgZ4vU/AEAWBsVtIsAA8M0yCIQswADwsfDzXCfAAAA0scPmA8AAAHri1KMjwADoIdKGrTDAAADYLpwoD8AAAIA0fnDdPwAAkOru/CVAAMBoPvqzDsAAoGonBbgWQADgQNAUkALAAACQVJbBGcAAgGZ2e3sXwAAAIBlQddu/ALDnX6czCsAAALivdDAqQAD63GoINDFAAADA36PE8j8AACjnMxH2PwAA0Am2lwJAAADQ9ATBJEAAAICkPq3SPwAAOEMvS/o/AABAVuTQ+T8AAPAj7vsrQAAAQBy/X/2/AAC9Qyb8CMAAAEQOGk8bwAAAvvspuBbAAAAQPuYqDEAAACYSVdgQQACA1NVLAzHAAADETE+rJMAA8FTa4PInQAAA6MDvyxFAADB4dzltIMAAACBUxDbmvwAAQEIrB+U/AADPpJdYMMAAAEDb41QnwAAAmil3PjTAAAAA6C/p878AANxXD/r0PwAAXc2rFhdAAAAinUvnCEAAALj9wfgJwAAA6pV/RCjAAAAQuWmHJ8AAAAADI/LqvwCAGaXyITTAAABAl5h8FsAAANQ/eNkhwADA9tEFiDDAAACA6EoW2L8AAAuvzP8xwAAAAhQ3lyfAAAB8L0CxNEAAAAD7LBXWPwDgjqe/98U/AAAZAl4fEsAAABeREk0NwAAAgHS36rA/AADMdwBfJUAAAExxOZkrwACAwH+MHyXAAICOz7l1FEAAAGDyGPsiwAAA/BHqWh7AACB8CSjyLcA=", "float64", [1, 16, 16]),
        'grad_param[3].GroupedLinear[1]': unpack("AAAAAIAOFsAAAAAA0O0DwAAAAAAAvP+/AAAAAACaEsAAAAAAQGwpQAAAAAAAXOe/AAAAAGDjIcAAAAAAwGQOQAAAAAAAvPM/AAAAAABmEUAAAAAAAIUTwAAAAAAAovo/AAAAAMBoFMAAAAAAADf7vwAAAAAAsAhAAAAAAKCiEEA=", "float64", [1, 16]),
        'output': unpack("dd4D0o7cAMDv6SKry6cMwLD+Lujysb8/CrQDVUFW7T+eqXc7HdPsP6zSEuFUd/8/cl5Cs4ozFMBqTmgQVLwJQKBMpKHwvARA1pL5L2+SDUA6qtKUQswCwKRJ5yR+yvC/rzSjCnO2BMD578IQ4/sUwDqtHwqG/+a/hFjoqkdc67/UlUalsrHvPxyxk3Xbnc8/EMfSJ0WsoD+IgrY8spPYP3DBonx1he8/KoARAc6J5j9AI0SfhJn/v8T1GRcWicQ/zLyH35UK0T8yyoj5w7H1P4oUo5VsbvW/RrSvAIwW5b+3PptGuuLSv2Tnqk8Vo+O/uMeLQfE34z8ldA0OfsLCv+4yRwkaUxbAcS93FQkDMkCKI287RRz3P2KzlcVC7AJAxonsY/JyFkBIeh6CJfwaQCCIHjxWixLAAR0mlHmuE0CIADXtcgUYwCatXOo5GSVAhF4F09Yk+78szSE4Au8VwL4BvvNSJQ3ADaI0O8A3GsAY/a8RPOHuv0CpVuRZoJs/PPCOrU/49j9A4rKY5bcgwMyOnDgblQDAirxY9kLuAUAQaM1CT63uP9FkW6xbw9s/UAJpYwWc/j+3LdYzuaz7v7QjfAV4nAVAaLdixMXGCcCOhQOy9W7Mv6oLKFbdl9C/G4VOiQpy8T8GPB+PB6IGQC4K4G3ZfvK/no1A3qUT1z/oFRS61xKzv3CJ7Z+KSADAaoPdMsQmB0DW40Jj8HH2P0hVxqSGf9u/SCEFmfJZtT+OJXObVh4MQOTFtJy0jQDAZJqeIkb31r+OT77vuIP2v2awO5U2oLG/5snxomaD9j9ATJ9ieCL+P5+e6iCpXAdAo6DKQoZM87/0fduBFnQSwK2h2sSWLuc/7q70TXXb7T8OZ3plerDiP1uL8x6wLfK/FlrofIFqEcDf1bYFGfAEwE1gJyrPKBxAjwSttMR+8L9/o3sMBbUGwHQcU5kAqPW/1HIMV+BQ7j+Exa9dPD3cP5ZTG+cMtew/S3JQ39Kl+j8h1kvzkIkCQHi/f//T/e4/37bKiuwSBcCQLEbtIPS5v2YZG3mqZva/r21VM5Xy4b/oCCRAftQGQPSj6c/GUe4/almS3mGBCMCdB+XUGsj2v9dSWj/xhgtA9jG/5bXg6r+geNzS+DENQP6wTRiHpr0/lr6ScPVBwD9aH032JmndPxuPiMapRPi/IvToohNhBMB8tiiY2rjwP3wPG0wKqfW/HuMaItxb5T8g8P95Jkazv0/8/3F74QXAxk9AmSWA+L9jC/KDBnEWQOZJI8mZc/E/RMZi8CI0tL8YhMFEAo7QP8mQ+RzwQ9E/tl4OUHeh5T+evH5i9W3Xv/bYd/pUAABAZqPBnRzpsj+wW6NuRC/4P7FuRcQDT+Q/45p5t+Ph9b+CU/V6WtfBPyCbeUDzZra/tI09ZSVo3r+ofjNiuznevym+o+DWbf4/wCnIjUqWqj/drABVfCvlPzC38H+umbe/YZ+eDfwO4z8mP9JSQenYPzAw4QDB1dK/SUu1TBoE8T+UYT3zLD7bv4q/Qh8g490/G2PgjXI4AUA7dG3hY+ESwN6u7TEiR/U/uKYakpDt9b+gE5znMJPlv2Es597i0fC/Srd/s9fLAED2AOoVXpoCwEMdqrT9ivg/eLnlFE1v87/zIAjo6VnrPyzyq6/go/A/LyEkm2Ml8T/GE+i/lRMCQLA+muxNQru/8Lca70Cwwj8R9bLHz2frP6D88lrhLZG/3IDxCKeDsb+MeLZmRsTcvxzIg8Wg494/0UUHbVlj0D+ijCjCcIbav89LEx/ATrk/W+rFtByw7T9oIe2bXmbyP5tJI9gopOK/FrBpfTn6yL/cp/f7j9jdv/YhW8W+PtE/1vZJisgA1D/2kRq2xa3kv7GwxNZe0+Q/D7MztXSj6j/U1PUEwojuP5THGuwK3aM/gByuS0LNEMArQPhAflf1v/JKw0N7NhpAbZwBgitm97+CRmVaQWwUwOFyi0dWy+e/whCP/fzU8j9Q5YpL9LrFv2gEDKUuKuM/WHvabUd5s78fIfFz6KD2P1Cq3TD3MwdAdUnep91V8r+6j5XRIZEHQLhZOf7Mw6y/kYygY8S09L8C6Fs62JXoPynmV+kwLdU/A8FQoPDYyT+MvWzF5d3kP8Oj4FIm9do/fPEq6gg96T/f8nTxIP3wP/4XTjSK9Nc/XPnXUasl879OkmH2lR7iv6D2vc8fkt8//BMRLth07b+acN+IjOj5PxCSbc7iT/U/4KdjtixM3b88vRMjTobFv6JMl+Yn/uo/OBtlSwsR1L/gjkjV+6P8v0xTL1l+SdK/asYomFmG7z8wP68rTI75P64ghavVDNa/PaPlzOaI6b9FAqda+HTpvyqv2b+wet6//578GuqE9T+snpoKHCbsP0ioJZrgK/M/roBcWm114T8e/N9xb57YP8vsbB5/buY/GNEUlM3P4b/EI/ZO7/Lev/i2ZMUFq7O/DUXSAq+zuT+AhUoXH8PivyobB3PU3PQ/oCZyFQzq67+XOI34B/jiv6JIvSzcpsW/8G3Y+azJqb959ych9p/xPxkkrvBaE/Y/pLtLdsJODsDx+dxcYLcBwE9CCFSDN/k/q7o4vl46F0BlJe1bvpMGQPWDaLHUmxRACn+OMtG17D+5y8hHo0UIQCYexO9GtRTAJKFCi71C8b/4Am34F+IMwLjakmjJKsm/2XW4y/es4j+7om2Er4T1v8PWBUyKnwHAQcTmdBgkAEA=", "float64", [16, 16]),
    },
]


def build():
    """The case with te.ops, as a user writes it: its Sequential and ops."""
    op0 = te.ops.ScaledSReLU(activation_recompute_in_mlp=True)
    op1 = te.ops.MakeExtraOutput(in_place=False)
    op2 = te.ops.AddExtraInput(in_place=True)
    op3 = te.ops.GroupedLinear(1, 16, 16, device=DEVICE, dtype=DTYPE, bias=True, accumulate_into_main_grad=True, single_grouped_weight=False, single_grouped_bias=False, delay_wgrad_compute=True, scale_bias=False)
    with torch.no_grad():
        op3.weight0.copy_(W3[0])
        op3.bias0.copy_(B3[0])
    op3.weight0.main_grad = torch.zeros(op3.weight0.shape, dtype=torch.float32, device=DEVICE)
    ops = [op0, op1, op2, op3]
    op1.set_extra_output_channel(0, 'c1', output_to_caller=False)
    op2.set_extra_input_channel(0, 'c1')
    model = te.ops.Sequential(op0, op1, op2, op3)
    return model, ops


def run(model, ops):
    """One call as gradfuzz makes it: what the oracle compares, by name; caller tensors changed."""
    x = X.to(DEVICE, DTYPE, copy=True).requires_grad_()
    extras = [E0.to(DEVICE, DTYPE, copy=True).requires_grad_(), E1.to(DEVICE, copy=True)]
    dys = [DY.to(DEVICE, DTYPE, copy=True)]
    caller = {"input": x, **{f"extra_input[{k}]": e for k, e in enumerate(extras)}}
    caller.update({f"cotangent[{k}]": c for k, c in enumerate(dys) if c is not None})
    pristine = {n: t.detach().clone() for n, t in caller.items()}
    with te.autocast(recipe=RECIPE):
        y = model(x, *extras)
    got = results(y, dys, [("grad_input", x), ("grad_param[3].GroupedLinear[0]", [ops[3].weight0]),
                           ("grad_param[3].GroupedLinear[1]", [ops[3].bias0]),
                           ("grad_extra_input[0]", extras[0])], zeros=False)
    if ops[3].need_backward_dw():
        ops[3].backward_dw()
    got["grad_param[3].GroupedLinear[0]"] = torch.stack([ops[3].weight0.main_grad])  # not autograd's
    return got, [n for n, t in caller.items() if not torch.equal(t, pristine[n])]


@pytest.mark.parametrize("fusions", [[], []], ids=['fused', 'unfused'])
def test_case(fusions, monkeypatch):
    only_fusions(monkeypatch, fusions)
    got, changed = run(*build())
    problems = check_all(got, EXPECTED[0])
    problems += [f"{n}: changed by the call (a caller tensor)" for n in changed]
    assert not problems, "\n".join(problems)


def results(outputs, cotangents, leaves, zeros=True):
    """The outputs by name, and d sum_k <outputs[k], cotangents[k]> / d leaf for the named
    leaves requiring grad (a list: one per group, stacked, None if one has none); where
    nothing reached one: zeros, or None with zeros=False."""
    outputs = list(outputs) if isinstance(outputs, (tuple, list)) else [outputs]
    got = {f"extra_output[{k - 1}]" if k else "output": o.detach()
           for k, o in enumerate(outputs)}
    pairs = [(o, c.to(o)) for o, c in zip(outputs, cotangents)
             if c is not None and o.is_floating_point() and o.requires_grad]
    flat = [(n, t) for n, ts in leaves for t in (ts if isinstance(ts, list) else [ts])
            if t is not None and t.requires_grad]
    if pairs and flat:
        grads = torch.autograd.grad([o for o, _ in pairs], [t for _, t in flat],
                                    [c for _, c in pairs], retain_graph=True, allow_unused=True)
        for (n, t), g in zip(flat, grads):
            zero = torch.zeros_like(t) if zeros else None
            got.setdefault(n, []).append(zero if g is None else g)
        for n, ts in [(n, ts) for n, ts in leaves if n in got]:
            stacked = torch.stack(got[n]) if all(g is not None for g in got[n]) else None
            got[n] = stacked if isinstance(ts, list) else got[n][0]
    return got


def check(name, got, e, atol, rtol, allowance=None, norm_bound=None):
    """Why `got` is off gradfuzz's bound of `e` (oracle/oracle.h), or None: all finite, |got - e|
    <= atol + rtol (rms(e) + |e|) + allowance (unjudged where inf), ||got - e|| <= norm_bound."""
    if got is None:
        fine = e is None or e.numel() == 0 or (name.startswith("grad") and not e.any())
        return None if fine else f"{name}: none returned"
    got = got.detach().to("cpu", torch.float64)
    e = torch.zeros_like(got) if e is None else e.detach().to(torch.float64)
    if got.shape != e.shape:
        return f"{name}: shape {list(got.shape)}, expected {list(e.shape)}"
    a = torch.zeros_like(e) if allowance is None else allowance.double()
    judged, finite, diff = ~a.isinf(), got.isfinite() & e.isfinite(), (got - e).abs()
    rms = torch.where(e.isfinite(), e, 0).square().mean().sqrt()
    bad = judged & (~finite | (diff > atol + rtol * (rms + e.abs()) + torch.where(judged, a, 0)))
    if bad.any():
        k = int(torch.where(bad, torch.nan_to_num(diff, nan=float("inf")), -1).argmax())
        return (f"{name}: {int(bad.sum())} of {e.numel()} off, worst at flat index {k}: got "
                f"{got.flatten()[k]:.9g}, expected {e.flatten()[k]:.9g}")
    error = torch.where(judged & finite, diff, 0).norm()
    if norm_bound is not None and error > norm_bound:
        return f"{name}: error norm {float(error):.3g} > {norm_bound:.3g}"


def check_all(got, expected):
    """What is off among the tensors either side has (channels: the reference's), by BOUNDS."""
    names = [n for n in {**expected, **got} if n in expected or not n.startswith("grad_channel")]
    problems = [check(n, got.get(n), expected.get(n), *BOUNDS.get(n, FALLBACK)) for n in names]
    return [p for p in problems if p]


def only_fusions(monkeypatch, names):
    """Only the fusions called `names` in TE's registry (fuser.py: OperationFuser's lists)."""
    def name(f):
        parts = f.__qualname__.split(".")
        owner = parts[-2] if len(parts) > 1 and parts[-2] != "<locals>" else None
        return getattr(f, "gradfuzz_fusion_name", None) or owner or parts[-1]
    for attr in [a for a in dir(OperationFuser) if a.endswith("_fusion_functions")]:
        functions = getattr(OperationFuser, attr)
        monkeypatch.setattr(OperationFuser, attr, [f for f in functions if name(f) in names])
