"""gradfuzz case /root/out/work/export/recipe-Float8CurrentScaling_findings_ce6dcfe141bbbeb6.json (te, float32, input [16, 16]): Dispatch -> GroupedLinear.

Reproduce: gradfuzz replay /root/out/work/export/recipe-Float8CurrentScaling_findings_ce6dcfe141bbbeb6.json --backend te
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

DTYPE, DEVICE = torch.float32, torch.device("cuda")


def unpack(data, dtype, shape):
    t = torch.frombuffer(bytearray(base64.b64decode(data)), dtype=getattr(torch, dtype))
    return t.reshape(shape).double() if t.is_floating_point() else t.reshape(shape)


# The values gradfuzz drew, float64 on the CPU, rounded to the case dtype
X = unpack("UJoUP2ar2z7YWJc/8tZLvwHz5z513OO+TkwTP2KMkD66jpa/xUGPPnx1xL/cf0E/eNOvvrYvSD9PTyM/LxdFPrWgnD/FkTO/+rHSvnrriz+I18E/xhNiv1OQnb/WrkO/eSa9viBs7b+xyQo/jJqrP5iWVkCI9hm/4c/iv0HLpL8cA0w/EjwMv2htnL834rm/SSW8v7Ux6T6B1M0/ajvYvlSZdb/7466+MKCyv9vNwz+8bxg/co7pPkQYJz9Zq0W+trbBvnZmdT+DGn0/29KZP2LSkr6GSgC/zVCgPpUF5b6yBXRAS7icvylhhr/Z3YG/2fOSvsEngT/YSLW/cTHRPkFBaj4Re9Y/bsMXwM8xNz/SN1c/UrKZPhBg977trb2/Qkiovovmrj//rrE/G0buv++9U75FtBo/VjUlPs/wgz+1tzK+ceJMv7GRET/3VmY+RbEBP6WPfL+Tnns/+MRRvyIzi79SlXA+F3GkvsTfbb6eLfi+XpRgv7ORtL85fsi+lthLP68NKUD/Sck/gI2bP6YMn79dA4U/BGBBPyg0Iz9wwMg/XxgSv+Jbej5Wkcq/tcuNv1VlrD+tqB8/ugRvPxbzhL7PMHC/L2OXPyWIlT9C7QO/zztjPut2XL7Tk4Y/ZPIDvzmC+j82YtG9M69aPzYoI7+tAba/3j1ovudTQT+VPW4/IE82P2t7Ir9qlKi/WugtPsvDXz+MBQ0+mX5aP/eQj7+ViW0+pvuCP1JetL4/jPs/z2ipPyDjmL83JYQ/JxKOPwl45r8MnPi/RS/lv8/X3z/CJPs/X46cP4t+9T6MFI2/P1CZP1da6L719R6/wRpAPvs3AEALQd++6VqxP/63175aKMo+gWXCPx5cgD//x2Q/o3HrP1CBSb5m2xO/XJRcPyXRib+HjxC/7WJKP65OHz64Jy8/TyOGvz65Gr++06M+mQ7TP93Y/D7A/JA+/OF5P/aDW75uBsO/amksP2GlGb4Ea4++XNzVv6pZWL//tsm/7BqbvvV5pr+b3Go+l+kQwDyEcT8G2Js+1Fq+v9uIDr9JxgRAMjc9v6xpGD/SiY2/jjrDP8GPiD5df909h787v3eBhL5u+6G/JXzuP23Gez9SDoy/yHsRv+BVEb821Yo+/Ul5vu03+r/+UGA+PbFbP2zdAMCq9kW/4n4cv7PgGsBRq4M/ovYtP//B07/Vp0K+Tsq+P8QD3b5UWMg/siM+v0eypr/Ggca/GXBSP84Igz8fq5I+dwAJvv3Pxj8XVzg+uV9XP+Ge67/sNAS/RofDPue6vT/whqC/iTAqvy+3eD8BQio+Shmqv6XsdD+CyJS/xnNAP3pjiz5w8vO/jOVNP3pPiz8qkNS/hvpmvg==", "float32", [16, 16])
W1 = unpack("uSYHvlK9aT7i9Eq+HicdPdX3or50yEa+QfNzPZLs3rvNWpi9sDvNPvPf+r2uzc6+juADv4gX8D0qpz6+Lw4AvglPqL7WOP29GAFkvhS/iL7ca24+0E0WPsNV9r1bBa8+O3XaPu/Ioz604mY9RIUevBBxtD3goSK+0cJLvmJ3BzztHqu8e11IPQpDrb7YA4e9s2PpPujDi76B/mW+mWjvPe8BlLnwg22+/ebpPPq4gr6gdXA+7RTcvgAcYT5h1Gy9OrF7vt6/bD1ulNc9sSt1PuYbjj0Qi4W9Lb/JvsCXZz45Mxy+t7pDvs0PIL50UhI+nVbZvv/fnL65w689gpwFPfXYdb4NpX++0FKjPRdbsD13+vo9RMAIvkNYUb6RmeG9FFONvj/m7j1zGiq++KgVPvLdvb5qisI9LZjlvp1rnb2o4Bk+6AdhPnJ/I74C5Lo9b3p0vcxcyb6YuFE9V63TvThGtT6WkTo+j8idvhfCrj0tbF48xp+XvqTTwr2FcYa++5rKvhti2j50jdi+DJJJviFCnz4fpSa+SwkfvS525z1uh3y98sy/vjv1bj3oniy9ymHSvWoZiL6tjdi+M6hYvSkFyb4ql7c+ER/0PQ81MT564k++QGw7PqRfzL2LCvK+LCHIvVYfbr2IPL2+NmWtvY9+tT2YhjY93z84Pl+tfD7fdrU+O8HCvrOcmLzkAOU9STLKPv0VDT6FbL0+uSSjPk0PlD3oztu9y4TWPU+83j34/JO++mR6PHjgEr/qAp895/d6vurGk715Nea7dUiLvcsjTTuQjMW9bqHAvM+2Mr31AMk+/+WTvekThj3eBYs+I28lvs1YHT4/eZS+KvkBP+rSBD4Ulcc+VpKbPSHVJLzycaW+UGNLvsui571ZqJ+9KVwFv+OWHL3kXOY9sqnsPDQYOL3PRCO+/ASgvh9tBL66SDm+RniRvr/Vu70JXta9LUKAPWCzRT6k1x2+bL4QPsL70z68xYS8VY5Qu1uDjD6I/L0+obmnvCES/T2tnjg+gmy2voDuhj5DcgM+0re/vfwfyj1l62M8Z21Rviw/mD47c0w9/739PrKbrT3eyAi98AJmPQCdDz8BbNm+yt6YPmSmJj2Rt0g9572lvl04wL3lRN++pcsAPNkPPj4mUgq+7UGAvr37+D5c98o+AG2wvogWkz3++0K9IhX4O2gY0L1c+UW+XxORPj6ytz6hT2Y+bNGXPCbkLD56kTM+ZrgSvlqFzT0lBNK97IwQvvtRLT7JjrO++RFiPr2Cb77EnQC9WDBOPsVUtT5nvt68gFV8vNFoZj7ovzG+c2uiPpMcEz679dK95GmIPC42kD0d29C+PvStvhTt0z6vlqO+DpWJvA==", "float32", [1, 16, 16])
E0 = unpack("K6YAQOzaCED9s9c/4dewP3Zs6j+EJPs/cUwTQDjwZEBYffI/bnjCPlARHD//Oi0/EMfxP3yFDUAhmso/Y8O/Pw==", "float32", [16, 1])
E1 = torch.tensor([16])
DY = unpack("SgeYPy19oT6bb/695vGEP2O9fD+GxwS/Mb7dv6BK7LxBTZ0/yjT5vlsyVb/Z6qu+jA0qv/Gixr6L+ZO/FT8JvxlTzD8o9Qy/jbOcv3PWv75Jypc+xijEv5pt3L+OMyC/rFFTPzrkdj/RAHU+JtvkP5Nmsr7+/JE+ejONv+0gUT+T9cm+8vsvv2ZTlL43tHu+E5xmPzn39j/zrL8/h+pPvcFjs73+4ig/t1HTP2Evjz5B1RM+XAwBv+hGf78sdkE/4n9FP9CO2L+rURk/GTy0P9jmDr/G66C/F7uXPmd5FL+JVhq/kadjvrN+fr9Lsas/jSlNv6Uf9z5exA6/ayEuvHju67/K73c/jKoiPttCG75gQuE/Ebrmvp5MGT8X8FQ/hHN7PowfQz/Ka/s+xZDhvJqHib9MNqO+xym1utepCz/gFMk/gM0aPx7YtL8oVQO/qhRbvvNTVj4kYqs/MGtBP1/+Eb/AEYO/Uc5aP2LxSr4iTac/IvQQu8+Djj9ihBa/wuoZv9HwPL907Ci/9BH6u1VACz3jeo++g9ZEPy+hVT64MiBAWCaOPr3AxT5o9IY/78Aiv3Q/9b+ktuM+fPTGvz4Aaj6F3QM+7qU5v4lYhD6/d0s/LPWdP9Kj+b44/QxA3/WoP7ua4b4VJCA/CQBwvzd0kj8GgsS+qu3iv5ALBsBLCAw/AiQSP1H3xD8dzMS/azG8PveGib9m0c0/nkM+PzBLeT2sKghATGmMPVczQL1Rubk/rUitOcy2fr9TbjG/migUPxwpm79ICB++bra5v/VXWz0YwR0/D33pPmIPFz8+mc6/ztJNPhBfoj+a9os+Py+DPwpP/z7iVos/HnY/P7NDTT4sxqi98aaOv6CILb8ZnfQ9nAiVv5vZWz5iW94/OUE+P11VaL0FMII/MExIP9LUjL/rUJs/I0rtPqDhD8BT0LY/XE8OPMOxwr/d58W/Vxwsvs9HsD/kgZA9btU4PsH7sb4nZABACzecvs3w7z8nDA6/8461v/jyhDuzATC+b88hPthMpb82Wx8+g/y7u4cX370mBoA+63EQP84+Bj9hgpg/mZRfP0aaAb8eu2K/AnIiPvy/ib9pyJ4/KWDkP1F1lT2zh6q//FftP1HFW7+UF4M/5MNzvwM6UL/luHg/6BKQvhdv6D1UzwC/uhvHvzNU/7+QWlG+KXZ9vhIMeb9r15o9kBV0PSxw9D97tcC/EZLkPwH2FEAr/PY+Il64P4fQfL+Vth0/8ga5v0lpYT9c+zK/6+U/v7cWDT/D4hE/+Sqdv3BUtL9K7ds+vgYOQAZ1sz8Al+I+npyBv/0U3z5zk5i9B9GAv/aFOr5DvPe+SBKKvyUaSrxd/cg/8ADAvw==", "float32", [16, 16])
DY2 = unpack("baA6vX/3tD8RICg/S0gDv5Csp78qbbC/rxPnPjPv7z9zLPM+z8ftvkHuBb/l3h0/WiQ0P9JEAsC+txbA1uSBvg==", "float32", [16])
RECIPE = recipe.Float8CurrentScaling(fp8_format=recipe.Format.HYBRID, use_power_2_scales=False, backward_override='dequantized')
FALLBACK = (1e-05, 1.3e-06)  # atol, rtol of the tensors BOUNDS does not name
BOUNDS = {  # tensor: atol, rtol, per-element allowance, norm bound
    'extra_output[0]': (1e-05, 1.3e-06, torch.tensor([0.0], dtype=torch.float64), 3.08e-05),
    'extra_output[1]': (1e-05, 1.3e-06, torch.full([16], 0.0, dtype=torch.float64), 4.52e-05),
    'extra_output[2]': (1e-05, 1.3e-06, torch.full([16], 0.0, dtype=torch.float64), 8.577772384031343e-05),
    'grad_extra_input[0]': (1e-05, 1.3e-06, torch.full([16, 1], 0.0, dtype=torch.float64), 4e-05),
    'grad_input': (1e-05, 1.3e-06, unpack("AADgIEsYyz4AAICon5LLPgAAgGUwNsw+AADAr4Mz0D4AAAieo8/LPgAA8KSXqso+AADQ/nWayT4AAMC0/UfNPgAAAHee/88+AADAl6RVzj4AABBpDOrKPgAAEPVRSMs+AABA8+e61j4AAECdsB7KPgAACLtFZtE+AACw4lWeyj4AAAB4YaHJPgAAYG0gNNE+AADwhjKc0T4AAECHfojLPgAAgIT4AM8+AAAg4KqK0T4AAIARMTPKPgAAQIzyN84+AACgvqdhzT4AAED7yfLQPgAAgFsiNc0+AAAQLzu5yj4AAMCFnPPSPgAAgMZHO9M+AAAQ7Yn3yz4AAMBYZdLQPgAA8NLObM8+AABAEdFW0j4AAAC0KUPLPgAAiMMTT8s+AADgEj+LzT4AAMCVdTfOPgAAABTzgs0+AADAaEhwzz4AAJhIyjTTPgAAQLR6Fsw+AACAERIyzD4AAIDuoTDMPgAAMMDEdMo+AADA2g/qyj4AAKDt3GDQPgAAoK7+AM8+AABB6CN5yz4AACCQUHXMPgAAAI3uh8w+AADovX0ezT4AACjKfCfNPgAAnDZHfMk+AAAA2m2Rzz4AANASYqDNPgAAYEnD088+AADg66tR0T4AABDOsQjKPgAA4LoJrco+AABYbzSOzz4AAECFYnjNPgAAQKXeqNI+AABgFujLyz4AAICfJ0nOPgAAMMC+ptA+AAAApArNyz4AAAgb6w/KPgAAAN/PHcs+AACALMt/zD4AAGAQAibMPgAA4CRAB8s+AACQgBGAzz4AAMAQ1OzNPgAAcHKnDss+AADAKxU50D4AAAg52LzQPgAAQDLtA8s+AABgpis80D4AAEA0SyHMPgAAYL30+9M+AACA6pbz2D4AAFypbIfQPgAAQA1GJco+AABAOFLOzT4AAKC6QzHLPgAAEIBYxsw+AABAYPQHzD4AAOB8G1/PPgAAYMk6v9A+AACAVgOtzT4AAODEUpfMPgAA0KH/IdE+AACAeB1s0D4AAOBJEkHQPgAAcFbH8Mw+AABgP6b+zD4AAACEQs3JPgAAoNbx7s0+AAAAxNX1yz4AACC8Wr3QPgAA4LnIeMo+AACAlaWn0T4AAODaKjTJPgAAAMiIn8w+AAAAKgZc1j4AAADJUGfPPgAAgIa+6tI+AAAAGDWxyz4AAECuTWDNPgAAQDh4Ac0+AABA0yR4yj4AAMDiR5zNPgAAQEjMmtA+AABgje51zz4AAECLpwDLPgAAwNxNsMs+AAAgCerVyz4AACC+0rzLPgAAwN6ifM4+AADg2+Vozz4AAMCdBMXOPgAAwB2rSMw+AADAxw6Tyz4AAABXooLSPgAAYLPoS8k+AAAAcaldzj4AAODkAULKPgAAwK8gINU+AADAdXbDzj4AAMAOn4jTPgAAwNjc1dE+AAAw5V//0T4AAKAxu8rOPgAA0ACEBtA+AABwjAfOzD4AAGBDMlfNPgAAuLuKQc8+AAAgvy+R0D4AAIAV8PjKPgAAoCEu0ck+AABg3uaK0j4AACCGlHXQPgAAgMOiptI+AADAa0QT0D4AAICORR3TPgAAoLkfKMo+AACQ/BRGyz4AAEC4nmDLPgAAYHPPqcw+AAAgUQgbyT4AAACWyPvJPgAAoJi8GtA+AADg4o9Vzz4AAJBE6k3NPgAAgHpHYsk+AACAJnQ/yz4AAAABv6zTPgAAwNHRJso+AAC0mSIOyj4AAOAtuczQPgAA4CyD3Ms+AACgxK96zD4AAIA9rzTLPgAAQGQpAck+AACAw71C0T4AAIAL80rOPgAAwNiRIM0+AACAvOjazj4AADDRHUzMPgAAEHHWZM4+AABg8GVLzT4AACA+qLzRPgAA8K+RUNE+AABgWATw0T4AAGC3213KPgAAQDSiFs0+AABwGbUSzj4AACvBxl/KPgAAcAp/4M4+AACQaxtx1T4AABCVl0zQPgAA4CwE2c0+AABAnZreyz4AAMB4KY/RPgAAgO01ZMs+AAAA5FLQzD4AAADykYzOPgAAhAkVk80+AACgBmw7yz4AAMDSi4XKPgAAIFdCns4+AAAwJkLSyj4AAICzw/rMPgAAYBEJqMk+AAAAyUz9yz4AAKAf+zXTPgAAcFHhjco+AADAuQrf0D4AAEAzswrNPgAAiFxEnc0+AACAUL1Eyz4AAODUPIDMPgAAgGN9P80+AAAA3+nPyT4AAEDdHCTJPgAAAI7Pi80+AAAg3CDfzD4AAIDWABvLPgAAwBeLVM4+AADoXozuyz4AAEDykgvKPgAAGKR+kco+AACg1LSnzT4AAIBBz/TNPgAAQFOs+9A+AAAAKD910z4AAEDk46LJPgAA4PADRMk+AAAAI4/zyj4AALBMnPDKPgAAALeGj80+AAAAbVRo0D4AACAX4uHNPgAAwBFZV80+AAAw3OrWzz4AAFAiCCfRPgAAUP0hrMo+AACAD8bMzj4AAAAxZCjWPgAAoMNqOMo+AACA8DGkzT4AAACCQ+LRPgAAAEndB80+AADAh5txyT4AAEDG2QvLPgAAgE/3WdA+AABQG8UF0T4AAABMfnTNPgAAsAnSccs+AAAgZQlYzz4AAOB5Cl/OPgAAgH9Xgs4+AADADQvnzT4AAJAfQ6fOPgAAIAuZSM0+AABAIu/c0z4AAEDxXOnLPgAAwGf1bc0+AACgsFdB0T4AAMAcuG/NPgAAAJJbxss+AADg8NTF0T4AAACiffrOPgAAAGWvEtA+AABgXl6Jyz4=", "float64", [16, 16]), 0.00018575411827131776),
    'output': (1e-05, 1.3e-06, unpack("AKaLL45xjD8A8LVuDlWPPwDiIpDjQ40/gHXbZkNVjz8Awm/Ko0ONP4AM72Bi4Iw/ALirSpvgjD8ArvJyw6aNP6Db2eFKtYw/AHDXV4CmjT8AlJHTgXGMPwBqg9q+4Iw/AGjKaTu1jD8A7scl46aNPwBIHBrRYos/AB4TdgBVjz8A1hRf6P6RPwAYIJY8x44/AI4Ju7Kfkj8AiPRisMaOP4D0dwVIn5I/AN4ZBvUQkj8AnlhzAxGSPwBCkxcpLpM/ABaTwshqkj8AIEpf+i2TPwDWGrJGepU/AFAqd+LGjj8Act88pSqWPwAwb3da7o8/ANqSDxlOkD8AlNWuv8aOPwD9B/R2wYw/APBqaaXojz8ABKwu3aaNPwDE3ael6I8/AEj0r0CnjT8A1VBA1zqNPwDAXTaU6I8/AEoqWDETjj8ALtOVnQuNPwD6plb5Eo4/ADDcpzjBjD+Atj91xjqNPwDQSsg6RpI/AFBwQNKkkD8AUrrQIZqLPwAuwM/hOo0/AKQnjA8BmT8AxCB/j46UPwC4bst1XJU/AM6aDXxukT+AfDgks+yRPwCsyvh+bpE/ANOMsXxukT8ASgnf9SqWPwCgcSYrN5E/AAL2jhxrkj8AJqWK8+CQPwCaj0J9jpQ/AOoANSk3kT8AFojSBCuWPwAWT2yeKJU/AEYyj6VukT8ABCsjEJ+QP4DVPR51VY0/AIwGS/LEjT8AtMhnWlWNPwDqHYEixI0/gGdjXx+tkD8A0BBq0FSNPwDKMoS/gpE/AMwbXljwkD8ATDc7iDKOP4Bj/chFn5A/AGNrxPaskD8AFOzvQPCQPwCGVpOBgpE/AGBHB2u1jj8ABHIPWq2QPwBKGESf95A/AOwl3O2GjD+AznT3euCMPwD+TCp2how/AEIGKrXkkD8AVgz/iYaMPwB9urVIhow/AG6/mLg6jT8AmDzoFX+PPwDfBVvGOo0/ALoP7rEhjD8AMPW2NsKOPwC0z86Ff48/gGvIENY6jT8Anvl7Xy2NPwCepy94how/AC54elgUkT8AMJKcrCORPwBEAA92mpE/gGxyMGPQjT8AbBcpcQ+UP4B8ZNqjI5E/AAzj54EjkT8A4r0uChGSPwCvF3ZejpQ/gBiNgw0Rkj8AISchWRSRPwA+tgigI5E/AFoKwMRukT8ABXTovMaOPwD0YXthV48/APyetEHQjT8AhGiIomGNPwCtzx/+7o0/ACRlR9bukD8AGjPSfoeQPwBFbdOE7pA/AK/rIALvjT8AjEDNWe+NPwAY52KP644/AHAvP9m3jT8Aj5BPa+uOPwAbTOaiYY0/ADNc2xLvjT8AIAF8XreNP4BAnI/eVZE/gH2hVNsIjD8A1DEgwYeQPwBKB9JiYY0/AL1mBaKHkD+AusH3KW2OPwAeKhKOh5A/AOIzzALvkD8APOY9de+NPwDtIAwP740/ANIZuFnrjj8ASA3j+guRPwDIWeB/644/AOwZB/e4kD8AlSKSAe+NPwDiiK5JPJM/AEpYWL1VkT8AhO7bcdmOPwB8d6DXF5I/AM6MeCuxjT8AUDo869CQPwDzQuZb0I4/AIZOnsjRkD8ADtb/dNCOPwCc+cKrSI4/ALwvq5dJjj8AaC11mFePPwA+mroSX5E/ANjuXLpXjz8Acj4aSTOTPwBM69scSY4/ADTma61ekT8AQDaivFePPwAYdRvWQ48/ALZ8fkXRkD8AkNTOsmGNPwAtZeL/7o0/AACf21Ztjj8AeS3I9O6NPwB3Z0aH7pA/AP6cby/vjT8AWbJNu+6NPwBu9/CeVZE/AIzcZuO3jT8Anva9WeuOPwBY9cOoYY0/ANIcOf/ujT8AcCtA6guRPwA+sfXTVZE/AHqd7ic8kj9A3HTKcYeQPwBg3kzpwYw/wI+jQ746jT8Aj9TrAKeNPwAKqhC7SpE/ABhyFb2mjT8AGpejKDuNPwCg4tCk6I8/ABhsmXESjj8AYLprkQuNPwBGg83sEo4/ADKTxIwekD8AXJpRvjqNPwA4p6KvC40/ABDdlOOkkD8A7IxcEJqLPwDY/2xzO40/AI7EjiIqkD8Axt9gpjaQPwC0croAPI0/AIqqJDs2kD8AVJ2zojyNPwC6PoaHNpA/AMqAR042kD8AjHCRzp+NPwDtZ944cpA/ANDlnN6ejT8ABiY6WHySPwBYVLYm2ow/AOLnKRrykj8AvMgBaJ+NPwBMSH9BE44/gLOcLBLajD+AHYdMbJ+QPwBiRnl4VY0/AIz5megXkT8ALDbe+lSNPwBko/0WxI0/AKyKiBKtkD8AEbNgpayQPwBqbCm3gpE/ANG1LkPwkD8APrP9kIKRPwBcLt5cn5A/AILLrPiskD8A8vtvOPCQPwBOI+12gpE/ABiMa5G1jj+A7TYGF62QPwChW/6vvJE/AMKb8QxfjD8A/nIWIbWMPwCUwMN+X4w/ABsJdbsSkD8AXthU6k+RPwBoijZXX4w/AM9z5JQLjT/AyWJO4+ePPwBE4U+3C40/AKgV+N9pjz8ARZ+QQV+MPwA8/el7548/AK4ZnJplkD8AEgO1u3CNPwAYaqY+X4w/AOTvhcxhjT8AZT80l4eQPwBavgCu7pA/AH9xLnOHkD8AQaPckW2OPwCmkTv47o0/AMTIOmmHkD8AgpXWZOuOP4Aww0bDt40/AOA2SGLrjj8AQP14NmGNPwA28Psx740/AD6Xgsc7kz8AGH9FzVWRPwDM+4by2I4/AK7ehW4Xkj8=", "float64", [16, 16]), 0.03144688622057816),
}
EXPECTED = [  # per call: tensor -> the float64 FP8 reference's value
    {
        'extra_output[0]': torch.tensor([16]),
        'extra_output[1]': torch.full([16], 1.0, dtype=torch.float64),
        'extra_output[2]': torch.tensor([0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15]),
        'grad_extra_input[0]': torch.full([16, 1], 0.0, dtype=torch.float64),
        'grad_input': unpack("TV7ajlq45z98ET7FZoIBwLCXKTQo39E/qIObe0lZ5T88pvkxx96nP6cLcLtymtY/iuLbtBL1zL+kbEYlNAfdPziHP6+FhtG/lpLvtNvi4z8XqJhA69Tdv7h6opWn66+/EBz3LTQ08b+oyZy6mgHPv0e3cCIz4ts/+iCoqsE9xr82KreCcE/wP8Gn0mXdSf6/yh2zm2zT1D8w5zml+t20v5h5ykeE+vG/rvYNceX05j840fzJa6HnPxy6RZSluto/wFfeg1JKhT/QCzi8hUjyP3ik8x0FeOo/bndLZ/xNwL/47mL4mo7kv3Yd9Mkp3/s/18/AD7CT1784noml/KPsP+QFssFUp7A/INMXUV3K9T+0aYMNmDnlv99kkLRxnc6/DAX1Uo0TwD+teg91ifD7v2g9ChexzNC/ONBpEN16yb+VJaDIeC7Yv7Lh6MbpL+G/cLLnEywK2L/ATy9MjCXaP7a6JfBbWs+/gsezr9sF4789dMfgZW78v76DKR8g6da/PwJzGsrOlj/TMvKDDOfkvxS9ohzrl+C/kyWj+jqpyD8LRINZcR3Jv/ns0/1j/LY/fLfutPy64L8KZZl1HJjHPwmd/sjscOC/S/xA+SEs8L/HUa7uwpXVP/rSaKTRM9q/lD2xkjBzpj8qo9lbIi3kv4CZeBF29/4/CLXriSvisT+ohayqCwnlv1HLML1AweG/MHcuW+c7wj/veXVcqDrFvy4cV3ewzvM/QIiG8Z3OyT9esibzmjnWv1psxb44pti/Pq1wTmzexb+Z9OTzL/X1v/4QYoNRv8S/aJv0+23G7j/IwwyDiBKkPz6ygpD6quG/EgMm/Pve7b+cRNvS+1bZP7+17uMKRvq/K9IYzhn6AUD5spf8BhDDP6gbyrkCLcC/yRKVDIl49b8EmrUHh0vGP5CVwdIMD5S/XNdFURNr2L9t26MMOmLiv6F6K4I6p/U/QDlpFISU3r9aQsTltG/fvze9fJWanem/zN/aANfd6z9bycUhd9z1v78G0795jNe/TvWwINGU1j9mrmZjn/H4v2HX2kdQvew/zPYRGB2R4j/JheN9u+b1P4Vx1rPty+0/EIh2y1/pzD/6wPZ7hHHZP+yOX92nQ+c/0+qIpzeIAsD0zp2zFlfkv7szPGbt1gJAsMWzd4RDyL/iSZo8v0jjv8l6yO+EDPC/upDbs0OO5T/Ch0XF5pjgv8A0QMgG1Mu/0oXa98dR1D/6epev7s7hP25IGors2uu/wMJZe/utgD+d3knWN5nuv16gt1MBuOa/dYhVjIpe4r8zSbqouYfwPzOvqzKfXvO/6r779Fgn5D843BohX9nSP0eOwuJ8U+G/mNdeCVCn2b+mr+Y0dbnTP+pUmYJ/3wDAtPj93HDm1j80Y4lnq8z2v+R0HzVz3PW/Abmmh7Dv7j+Ou43iqEvTv0d3NMdlwue/4fVYAg3L0j85JeMc5+rjPyd6vgnwksk/YruJnkdd5j+wklUgzLrWv0dGE1kH+ug/3JLcXR6X2T95tyHgl2n2v45Fmc7z3fo/mHBo5kIk47+bF3LFRAgFQA5zt4ysR9M/hISf9OJltL/J4Et2KED6v0fEsb1+lue/lumIPfc00j+uxiCkGzf3v8rt8MUvb+q/w8cPMzXe6T++lLVUsUjBv4CEdQMp/ue/AGIRehRTrD+iY2hGWav2PzrXmUkrHOK/zeuihs/Rt792JNH6uybkv+2duCj1c+O/oo1x+L4H0j9gCiMoqVvKPxm2yb9ipv+/jm24WfZJ+D8ghOsqUyrFP7nrszBDO/q/kI46b7Gv67+suSE2/rW5v1wesOPx9L0/L3i+QnvZ6T+OzC0Uws3jP6tjbG0vruO/ZBzHboU42z8ys1vJBSvVP05aGEHS7OC/7+LxUQzr1r9UpUBvJip8v/+Bzj4EjNG/Zf9078tU6L/oD2ZpplS2vxNqKweImuA/auKnyM/V5L8OeFV0GNMFQDDwCQfMENQ/5u9yzxFV8L/iE5wJF9vyPwQfft+8J5Q/4ag+EkiI6j++WHDTdPfhv2VbVQ210Os/u7PqnSX31z8ksxwwDxb0PzeRo0WeIek/DFGyJ3+c6j+tgh5q4630P5FZW2ZHnNq/3AXWXAMR9D/Q7Th6Gma1v/xGKUuIcK4/aGa7lru69L+t0Jpj5hrlvyDPfImHrcu/6aW4oac+AMA16D3/stX1P3Idn61Gnvq/jU9cX52b4D9gTzvxP5HpP5Ze+JTLN+u/c1GhwBiHwD8+4L/IiTzkP80IQ+y8GMm/vEJ8SejVy78ArnBic4KCv/AGD4Qzsv+/lp3bt3Wh9r/nM71iRc73v82XfJ32FOG/PD4AkAlj4L9GrKA/oJ/HP85AkO1wo/G/IdxFMLo6AEA2TRsRi+fcv2P3cI7jI/O/Gz81roct3T8vNSw14OPsv2Da6Y6v6YI/bEObSHw38z8iOovyra3yv27Csmt3EdO/6JM9jcfQ9r9mwEPLjaD+P+hlRKG9Hdm/i+0HfrXI/b/gbSFsUi+iv1xC/cHU8OE/YZq/CJ4X478w7BzQT+TOP+Zjx+//oca/WGHjJlayvT+FY6R04Njlv6z9xIkMAPs/cy8yLAPh/T+ihnUWnTzOv+y7XxU+ZsQ/mOLmJOKn8L8bGNcLX9fzvwuGFs4rYPS/22E8hnwp+L83ew+uJcb1v54SSyswlvc/upfAVOw36b8iZeSnN3/3v4LgOKOnYvg/nzuuFPF/6b8=", "float64", [16, 16]),
        'output': unpack("+G9ypXhitb9tXEfAy5vwv5/9ASqD+eS/XZhKeJXlwT8eSD40fPzWPy9xVrpKLcG/9r0guscO6L/2NBmsnCPVP0NuUmU8MKu/NFA0Ty4U3b8Qlrgt8M3ZPx3SWAh7dea/PF0i9N4M0j8l0MwJQUftv1L6xuC9n+M/vfV0OHtt4j+/v9nHo2UKwHT4CW1eC9q/3np61UL1/T8cMyn/84Xbv3ZvAl8zIMc/9Pm/ssDk5D+aXSki3MfwP7i/qDC69vG/vIADH4+A7z9ONpkSAH/gv/z4E0ERO+g/VoF1Kfhl7T/QZbuOH3D2v+PRuvLFQfe/hL+kqHKw8r98qwisUNrzv6cfmLgWsdq/pqHu6t5S7L8wQtHGOLTuv3gSeVq4QPW/UuaROMCt5L88Wy+hgPq4P/Lkqn04bum/tPpnnChIwj+KqwmO4qvTv6qANXZGuN+/6JbITQ7nxj/bzy0S+kHOP38bgVmsFPi/flx6Cnep5D9XSSJJTsfiv0XMIWnUpum/0hPGh9KS4D8c5o2weGfVPxql+nFA5ei/+A2P6CvE079VSbzWu7TSv21bmZtaU/g//g0pdpmx0z+ICucx/anvP85dYONsF+A/dMfN2qnIAECqSOKVnBn1v5D3+GquIN0/GO1uQTNO7z/exXmhVsT+vy9xVrpKLQFAxnAbcXKX8j+Ziy4Edfv7P53T2xSURcE/jJCgjsEG7j+I0G3Fq+/rv92EhRbdNeG/VIM1Qw1vtr9qC5HfiLDsP/gevnf3Fe0/Bvhnz2GR679QH15R0OzLvyPTBVy88NI/b6gBsYxo7r8h7JS8i6HxP61Qc/6J5wJAInBCEuXN5L/nUNtWBKb6P3gEfvcWkuI/uAGwgQcT3L+qNK3tnie2v2iVeHo+ILw/OPmxVsZu9z+y5HLaFU3aPydt1oYgG98/ypcMiQfb07/D+mh+uhnyP3a8na2uPs2/9QvPzha76j9js8qJYw7yv/ir3mQoL+K/cb72cp9jxj/60e/vMu7WPwNArotc9+A/0s2lV39I9D8vP2sy9dTzv8eJ22grt/m/kZVI56qLy7/NgbFUYs37v1a9rq9eKcq/necQvZE38L/4qsueVKH1P0b4n3KEstq/cw2FFHmU1T/wNLF15m2lP8qu3lOz7vC/vASDYfCp8T/CmLj6toTAv0rnPapvVwFAFfG6WYKFAUAgvwPtBwjUPwmoky5ryd8/rq5+MRkm779c8HnEPgb0P3NZDZ0gJe8/WCCmFBEnqL/GuW/N74T1v3S/1v8p6NK/5oPZpC2M5D/W0YbX6mbHP+5ItMYsKMQ/4pZh+ekCxz9CE4iYRIjiP7ohJnt0gsM/TQxvqO+RyT//8FIjzM/xv9PvoinV3+W/KlqBa62t3D8tNNc0x9LHvyYLJgMdhv2/ECAGOzhQ6b+mb2xZDXn2v0n5f/8ON9c/F/kVBTXe5792+RwzMpnmP+BuXv0SA6m/5vm+0C4T5T/x+gWy3XvRP7zihY+aEgBAPCLJ+gLO8T9w4ydxH57uvyvOEvgOFvM/rDUnCJeZwr8/E7vRjZHyP7HkpRNfVtq/rQ428AFWAcDUXOeqBnfDP360DSdTQv+/DIQPhCwK5L+PvsX9ef31v5shvWIs+wNAMOO8lLNzvz9QFargLG/8v9Thp8YzMeM/zxYt7UU/9z+y+HRJyjXpP13To3FxJPK/cjTcnqDq9j87q9AILrn0v+6EU78l/sC/193TkZcK8b8r+sM6CCvUP1usfyCT1+A/poocIDM/379YqvMhWamnv5zjKhfVEu4/dFrtKaup6z+DGOe6717hP9rmmwxz3eK/0gpT8Pql3j/E0AvbYCPbP1vnC1O4HwHAlt3198nVAEAphBFIUK3Dv1HSj8kLxfU/oiBEKsZapz/rrF+xqrzcPxxLpZnvqP0/nVJi62S89D9FSHQTe3rmP0HRrlrvbvk/xl35jkgz4D9eye8AzqbiP7xIfQWc2MQ/oIABW2vd7z+uXLHLB/nzv+WfBSirXvE/YZsYMi12+L+u5sufBnLzPw02+HhZ3/k/XlhkjZ7e8T8GmrJQBgb7P8SSS3wROPS/uJZeUzSO5z+UIjabkpvwP3QV4L8r7fu/hEm/fHEp8j86UsEv+hP2PzaoMGKOK9+/ddA7TDCv8z80EnTw3ijmP0zT1cgoXNI/BPWYRJozCUCM0DqMYubrP6xvBud6ZuY/fKgDdbALrr9pGfOWTkPfP74e7Sj52N2/uuXTQAGh5D+ig9Q6VHT1P+C9uIMRWeg/MEnsaU9Jsz8Eg5VpNJjHP0yssXdKD/G/ArwuSfvN3j9QgiGbpw/Kv3bl54o0p+e/YG/NYcZz178Q9FT4Pjv4v0J4bEhywPq/MG6C+M/Euz83RoDeipbdP89HOOgQE+g/4ouawnL32j9T2jq3NX7hv4gzZEjMG+o/twpRLNcC7z9GYkfRByj6P7GY6lFuvPA/Vpiw6if4wb8gbeIe9+1sv2ju8En2Q/I/fwTlSzt28j98Ie7XUWG0P5qK6ARYZP8/JPoprZo95L+3bRR2riXtP4y95XDveNk/8I3BMKzk8z+TK25P3gzsP7yq4mx5E/A/U6KXlBR/4b9jhK9dBeHSP/6VUPc5GNq/eVq68GGg+z/ebUpVraPcvzJu6i6Gers/YvihNqhV6r9nNbtJmZ3zP0nkN5E9t+u/Jd8Q8PD4A0Cjtb/CqczyP+yVgk7xT+q/SQ1QBqrjAUA=", "float64", [16, 16]),
    },
]


def build():
    """The case with te.ops, as a user writes it: its Sequential and ops."""
    op0 = Dispatch(1, output_style='vector')
    op1 = te.ops.GroupedLinear(1, 16, 16, device=DEVICE, dtype=DTYPE, bias=False, accumulate_into_main_grad=True, single_grouped_weight=False, single_grouped_bias=False, delay_wgrad_compute=False, scale_bias=False)
    with torch.no_grad():
        op1.weight0.copy_(W1[0])
    op1.weight0.requires_grad_(False)
    op1.weight0.main_grad = torch.zeros(op1.weight0.shape, dtype=torch.float32, device=DEVICE)
    ops = [op0, op1]
    model = te.ops.Sequential(op0, op1)
    return model, ops


def run(model, ops):
    """One call as gradfuzz makes it: what the oracle compares, by name; caller tensors changed."""
    x = X.to(DEVICE, DTYPE, copy=True).requires_grad_()
    extras = [E0.to(DEVICE, DTYPE, copy=True).requires_grad_(), E1.to(DEVICE, copy=True)]
    dys = [DY.to(DEVICE, DTYPE, copy=True), None, DY2.to(DEVICE, DTYPE, copy=True), None]
    caller = {"input": x, **{f"extra_input[{k}]": e for k, e in enumerate(extras)}}
    caller.update({f"cotangent[{k}]": c for k, c in enumerate(dys) if c is not None})
    pristine = {n: t.detach().clone() for n, t in caller.items()}
    with te.autocast(recipe=RECIPE):
        y = model(x, *extras)
    got = results(y, dys, [("grad_input", x), ("grad_param[1].GroupedLinear[0]", [ops[1].weight0]),
                           ("grad_extra_input[0]", extras[0])], zeros=False)
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


# --------------------------------------------------------------------------------------
# What the case's ops need that TE lacks, as TE users write it (gradfuzz_adapter/te)


class CustomOp(te.ops.BasicOperation):
    def __init__(self, *, output_style="vector"):
        super().__init__()
        self.output_style = output_style

    def op_forward(self, *args, **kwargs):
        raise RuntimeError(f"{type(self).__name__} runs fuser_forward and fuser_backward")

    op_backward = op_forward


class GradfuzzError(Exception):
    kind = "unrecognized"


class InvalidArgumentError(GradfuzzError, ValueError):
    kind = "invalid-argument"


def _shape(t):
    return "<undefined>" if t is None else str(list(t.shape))


def check_2d(op, x):
    if x is None or x.dim() != 2:
        raise InvalidArgumentError(f"{op}: input must be 2-D [rows, features], got {_shape(x)}")


def check_logits(op, logits, rows, groups):
    if logits is None or logits.dim() != 2 or tuple(logits.shape) != (rows, groups):
        raise InvalidArgumentError(
            f"{op} slot 0: router logits must have shape [rows={rows}, G={groups}], "
            f"got {_shape(logits)}"
        )
    if not logits.is_floating_point():
        raise InvalidArgumentError(
            f"{op} slot 0: router logits must be floating point, got {logits.dtype}"
        )


def opmath(t):
    return t.float() if t.dtype in (torch.float16, torch.bfloat16) else t


def pack(style, tensors):
    return (t for t in tensors) if style == "generator" else tuple(tensors)


class Dispatch(CustomOp):
    num_extra_inputs = 1
    num_extra_outputs = 3

    def __init__(self, groups, *, output_style="vector"):
        super().__init__(output_style=output_style)
        self.groups = groups

    def fuser_forward(self, basic_op_ctxs, input_, *, basic_op_extra_inputs, **unused):
        (logits,) = basic_op_extra_inputs[0]
        check_2d("Dispatch", input_)
        check_logits("Dispatch", logits, input_.shape[0], self.groups)
        probs_full = torch.softmax(opmath(logits), dim=1)
        group = torch.argmax(logits, dim=1)
        routing_map = torch.sort(group, stable=True).indices
        split_sizes = torch.bincount(group, minlength=self.groups).to(torch.int64)
        token_probs = probs_full.gather(1, group.unsqueeze(1)).squeeze(1)
        token_probs = token_probs.index_select(0, routing_map).to(logits.dtype)
        ctx = basic_op_ctxs[0]
        if ctx.requires_grad:
            ctx.save_for_backward(routing_map, probs_full, group)
            # TE's convention (swiglu.py: _ScaledGLU.fuser_forward): the extra input's
            # requires_grad says whether its gradient is wanted.
            ctx.logits_requires_grad = logits.requires_grad
            ctx.logits_dtype = logits.dtype
        extra = (split_sizes, token_probs, routing_map)
        return input_.index_select(0, routing_map), [pack(self.output_style, extra)]

    def fuser_backward(self, basic_op_ctxs, grad_output, *, basic_op_grad_extra_outputs):
        ctx = basic_op_ctxs[0]
        routing_map, probs_full, group = ctx.saved_tensors
        # grad_output [rows, n] scattered back: grad_input[map[i]] = grad_output[i]
        grad_input = torch.empty_like(grad_output).index_copy_(0, routing_map, grad_output)
        grad_probs = basic_op_grad_extra_outputs[0][1]
        grad_logits = None
        if ctx.logits_requires_grad and grad_probs is not None:
            rows = probs_full.shape[0]
            # back to the original row order, then d p_k / d l_j = p_k (delta_jk - p_j)
            gp = torch.zeros(rows, dtype=probs_full.dtype, device=probs_full.device)
            gp = gp.index_copy_(0, routing_map, grad_probs.to(probs_full.dtype)).unsqueeze(1)
            p_k = probs_full.gather(1, group.unsqueeze(1))
            one_hot = torch.zeros_like(probs_full).scatter_(1, group.unsqueeze(1), 1.0)
            grad_logits = (gp * p_k * (one_hot - probs_full)).to(ctx.logits_dtype)
        return grad_input, [()], [pack(self.output_style, (grad_logits,))]
