"""Reading numbers, dates, times, phone numbers and units aloud in Chinese characters.

Rules and their order follow GPT-SoVITS's zh_normalization (itself from PaddleSpeech), so the
normalised text, and therefore the phonemes, match upstream.
"""

from __future__ import annotations

import re

DIGITS = "零一二三四五六七八九"
_UNITS = ((8, "亿"), (4, "万"), (3, "千"), (2, "百"), (1, "十"))  # power of ten -> unit


def _cardinal_parts(value: str, use_zero: bool = True) -> list[str]:
    stripped = value.lstrip("0")
    if not stripped:
        return []
    if len(stripped) == 1:
        if use_zero and len(stripped) < len(value):
            return [DIGITS[0], DIGITS[int(stripped)]]
        return [DIGITS[int(stripped)]]
    power, unit = next((p, u) for p, u in _UNITS if p < len(stripped))
    return _cardinal_parts(value[:-power]) + [unit] + _cardinal_parts(value[-power:])


def verbalize_cardinal(value: str) -> str:
    """'120' -> 一百二十; a leading 一十 is read 十."""
    if not value:
        return ""
    value = value.lstrip("0")
    if not value:
        return DIGITS[0]
    parts = _cardinal_parts(value)
    if len(parts) >= 2 and parts[0] == DIGITS[1] and parts[1] == "十":
        parts = parts[1:]
    return "".join(parts)


def verbalize_digits(value: str, alt_one: bool = False) -> str:
    """Digit by digit; `alt_one` reads 1 as 幺 (phone numbers)."""
    text = "".join(DIGITS[int(d)] for d in value)
    return text.replace("一", "幺") if alt_one else text


def num_to_chinese(value: str) -> str:
    """'3.20' -> 三点二零 style reading of an unsigned integer or decimal string."""
    integer, _, decimal = value.partition(".")
    if "." in decimal:
        raise ValueError(f"The value string: '${value}' has more than one point in it.")
    result = verbalize_cardinal(integer)
    decimal = decimal.rstrip("0") + "0" if decimal.endswith("0") else decimal.rstrip("0")
    if decimal:
        result = (result or DIGITS[0]) + "点" + verbalize_digits(decimal)
    return result


def _time_part(value: str) -> str:
    result = num_to_chinese(value.lstrip("0"))
    return DIGITS[0] + result if value.startswith("0") else result


_TIME = r"([0-1]?[0-9]|2[0-3]):([0-5][0-9])(:([0-5][0-9]))?"
RE_TIME = re.compile(_TIME)
RE_TIME_RANGE = re.compile(_TIME + r"(~|-)" + _TIME)


def _clock(hour: str, minute: str, second: str | None, half_minute: str) -> str:
    result = f"{num_to_chinese(hour)}点"
    if minute.lstrip("0"):
        # Upstream tests the *first* time's minute for 半 in a range too; kept for equal output.
        result += "半" if int(half_minute) == 30 else f"{_time_part(minute)}分"
    if second and second.lstrip("0"):
        result += f"{_time_part(second)}秒"
    return result


def replace_time(match: re.Match) -> str:
    groups = match.groups()
    result = _clock(groups[0], groups[1], groups[3], groups[1])
    if len(groups) > 5:
        result += "至" + _clock(groups[5], groups[6], groups[8], groups[1])
    return result


RE_DATE = re.compile(r"(\d{4}|\d{2})年((0?[1-9]|1[0-2])月)?(((0?[1-9])|((1|2)[0-9])|30|31)([日号]))?")
RE_DATE2 = re.compile(r"(\d{4})([- /.])(0[1-9]|1[012])\2(0[1-9]|[12][0-9]|3[01])")


def replace_date(match: re.Match) -> str:
    result = f"{verbalize_digits(match.group(1))}年"
    if match.group(3):
        result += f"{verbalize_cardinal(match.group(3))}月"
    if match.group(5):
        result += f"{verbalize_cardinal(match.group(5))}{match.group(9)}"
    return result


def replace_date2(match: re.Match) -> str:
    year, month, day = match.group(1), match.group(3), match.group(4)
    return f"{verbalize_digits(year)}年{verbalize_cardinal(month)}月{verbalize_cardinal(day)}日"


_UNIT_ALT = r"(%|°C|℃|度|摄氏度|cm2|cm²|cm3|cm³|cm|db|ds|kg|km|m2|m²|m³|m3|ml|m|mm|s)"
_NUM = r"((-?)((\d+)(\.\d+)?)|(\.(\d+)))"
RE_TO_RANGE = re.compile(_NUM + _UNIT_ALT + "[~]" + _NUM + _UNIT_ALT)
RE_TEMPERATURE = re.compile(r"(-?)(\d+(\.\d+)?)(°C|℃|度|摄氏度)")
# Order matters: upstream replaces the first matching key first (cm2 before cm, m before mm).
MEASURES = {
    "cm2": "平方厘米",
    "cm²": "平方厘米",
    "cm3": "立方厘米",
    "cm³": "立方厘米",
    "cm": "厘米",
    "db": "分贝",
    "ds": "毫秒",
    "kg": "千克",
    "km": "千米",
    "m2": "平方米",
    "m²": "平方米",
    "m³": "立方米",
    "m3": "立方米",
    "ml": "毫升",
    "m": "米",
    "mm": "毫米",
    "s": "秒",
}


def replace_temperature(match: re.Match) -> str:
    sign = "零下" if match.group(1) else ""
    unit = "摄氏度" if match.group(4) == "摄氏度" else "度"
    return f"{sign}{num_to_chinese(match.group(2))}{unit}"


def replace_measures(sentence: str) -> str:
    for notation, reading in MEASURES.items():
        sentence = sentence.replace(notation, reading)
    return sentence


_POW = "[⁰¹²³⁴⁵⁶⁷⁸⁹ˣʸⁿ]"
_OPERAND = rf"((-?)((\d+)(\.\d+)?{_POW}*)|(\.\d+{_POW}*)|([A-Za-z]{_POW}*))"
RE_ASMD = re.compile(_OPERAND + r"([\+\-\×÷=])" + _OPERAND)
_ASMD_WORDS = {"+": "加", "-": "减", "×": "乘", "÷": "除", "=": "等于"}
RE_POWER = re.compile(_POW + "+")
_POWER_CHARS = str.maketrans("⁰¹²³⁴⁵⁶⁷⁸⁹ˣʸⁿ", "0123456789xyn")


def replace_asmd(match: re.Match) -> str:
    return match.group(1) + _ASMD_WORDS[match.group(8)] + match.group(9)


def replace_power(match: re.Match) -> str:
    return "的" + match.group(0).translate(_POWER_CHARS) + "次方"


RE_FRAC = re.compile(r"(-?)(\d+)/(\d+)")
RE_PERCENTAGE = re.compile(r"(-?)(\d+(\.\d+)?)%")


def replace_frac(match: re.Match) -> str:
    sign = "负" if match.group(1) else ""
    return f"{sign}{num_to_chinese(match.group(3))}分之{num_to_chinese(match.group(2))}"


def replace_percentage(match: re.Match) -> str:
    sign = "负" if match.group(1) else ""
    return f"{sign}百分之{num_to_chinese(match.group(2))}"


RE_MOBILE_PHONE = re.compile(r"(?<!\d)((\+?86 ?)?1([38]\d|5[0-35-9]|7[678]|9[89])\d{8})(?!\d)")
RE_TELEPHONE = re.compile(r"(?<!\d)((0(10|2[1-3]|[3-9]\d{2})-?)?[1-9]\d{6,7})(?!\d)")
RE_NATIONAL_UNIFORM_NUMBER = re.compile(r"(400)(-)?\d{3}(-)?\d{4}")


def replace_mobile(match: re.Match) -> str:
    return "，".join(verbalize_digits(part, alt_one=True) for part in match.group(0).strip("+").split())


def replace_phone(match: re.Match) -> str:
    return "，".join(verbalize_digits(part, alt_one=True) for part in match.group(0).split("-"))


RE_RANGE = re.compile(r"(?<![\d\+\-\×÷=])((-?)((\d+)(\.\d+)?))[-~]((-?)((\d+)(\.\d+)?))(?![\d\+\-\×÷=])")
RE_NUMBER = re.compile(r"(-?)((\d+)(\.\d+)?)|(\.(\d+))")
RE_DECIMAL_NUM = re.compile(r"(-?)((\d+)(\.\d+))|(\.(\d+))")
RE_NEGATIVE = re.compile(r"(-)(\d+)")
RE_VERSION_NUM = re.compile(r"((\d+)(\.\d+)(\.\d+)?(\.\d+)+)")
RE_DEFAULT_NUM = re.compile(r"\d{3}\d*")
# Measure words after which a number is read as a count (二 -> 两); upstream's list, verbatim order.
_QUANTIFIERS = "(处|台|架|枚|趟|幅|平|方|堵|间|床|株|批|项|例|列|篇|栋|注|亩|封|艘|把|目|套|段|人|所|朵|匹|张|座|回|场|尾|条|个|首|阙|阵|网|炮|顶|丘|棵|只|支|袭|辆|挑|担|颗|壳|窠|曲|墙|群|腔|砣|座|客|贯|扎|捆|刀|令|打|手|罗|坡|山|岭|江|溪|钟|队|单|双|对|出|口|头|脚|板|跳|枝|件|贴|针|线|管|名|位|身|堂|课|本|页|家|户|层|丝|毫|厘|分|钱|两|斤|担|铢|石|钧|锱|忽|(千|毫|微)克|毫|厘|(公)分|分|寸|尺|丈|里|寻|常|铺|程|(千|分|厘|毫|微)米|米|撮|勺|合|升|斗|石|盘|碗|碟|叠|桶|笼|盆|盒|杯|钟|斛|锅|簋|篮|盘|桶|罐|瓶|壶|卮|盏|箩|箱|煲|啖|袋|钵|年|月|日|季|刻|时|周|天|秒|分|小时|旬|纪|岁|世|更|夜|春|夏|秋|冬|代|伏|辈|丸|泡|粒|颗|幢|堆|条|根|支|道|面|片|张|颗|块|元|(亿|千万|百万|万|千|百)|(亿|千万|百万|万|千|百|美|)元|(亿|千万|百万|万|千|百|十|)吨|(亿|千万|百万|万|千|百|)块|角|毛|分)"
RE_POSITIVE_QUANTIFIERS = re.compile(r"(\d+)([多余几\+])?" + _QUANTIFIERS)


def replace_number(match: re.Match) -> str:
    if match.group(5):  # '.5' with no integer part
        return num_to_chinese(match.group(5))
    sign = "负" if match.group(1) else ""
    return f"{sign}{num_to_chinese(match.group(2))}"


def replace_range(match: re.Match) -> str:
    first = RE_NUMBER.sub(replace_number, match.group(1))
    second = RE_NUMBER.sub(replace_number, match.group(6))
    return f"{first}到{second}"


def replace_to_range(match: re.Match) -> str:
    return match.group(0).replace("~", "至")


def replace_negative(match: re.Match) -> str:
    return f"负{num_to_chinese(match.group(2))}"


def replace_version(match: re.Match) -> str:
    return "".join("点" if c == "." else num_to_chinese(c) for c in match.group(1))


def replace_quantifier(match: re.Match) -> str:
    number = num_to_chinese(match.group(1))
    number = "两" if number == "二" else number
    more = "多" if match.group(2) == "+" else (match.group(2) or "")
    return f"{number}{more}{match.group(3)}"


def replace_default_number(match: re.Match) -> str:
    return verbalize_digits(match.group(0), alt_one=True)
