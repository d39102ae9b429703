"""A seeded generator of school-level math problems with worked solutions (the embedded math domain).

Problem ``i`` of seed ``s`` is a pure function of ``(s, i)``: its random draws
come from ``random.Random`` seeded with a SHA-256 of ``(s, i)`` and use only
``Random.random()``, the one part of the module whose sequence Python
guarantees across versions, so the text is identical on every interpreter.
Arithmetic is exact (integers and ``fractions.Fraction``); every answer is
computed, never templated, and the tests check the stated answers.

Topics: order of operations, long multiplication and division, fractions,
linear equations, systems of two equations, percentages, geometry, statistics,
factors (GCD/LCM), powers and roots, and word problems (rates, money, sharing,
work, ratios, ages).
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Callable, Iterator, Sequence
from fractions import Fraction


class Draws:
    """Integer and choice draws built on ``random()`` alone (version-stable)."""

    def __init__(self, seed: int, key: str):
        digest = hashlib.sha256(f"math-problem:{seed}:{key}".encode()).digest()
        self._rng = random.Random(int.from_bytes(digest[:8], "big"))

    def int(self, lo: int, hi: int) -> int:
        """Uniform integer in [lo, hi]."""
        return lo + min(int(self._rng.random() * (hi - lo + 1)), hi - lo)

    def nonzero(self, lo: int, hi: int) -> int:
        while (v := self.int(lo, hi)) == 0:
            pass
        return v

    def choice(self, options: Sequence):
        return options[self.int(0, len(options) - 1)]


NAMES = ("Ava", "Ben", "Chloe", "Daniel", "Elena", "Farid", "Grace", "Hiro", "Isabel", "Jamal", "Kira", "Liam",
         "Maya", "Noah", "Olivia", "Priya", "Quinn", "Rosa", "Sam", "Tariq", "Uma", "Victor", "Wen", "Yusuf", "Zoe")
ITEMS = (("notebook", "notebooks"), ("pencil", "pencils"), ("apple", "apples"), ("ticket", "tickets"),
         ("book", "books"), ("sandwich", "sandwiches"), ("marker", "markers"), ("cup of coffee", "cups of coffee"))


def fmt(x: Fraction | int) -> str:
    """An exact number as text: integers plainly, other fractions as a/b (sign in front)."""
    x = Fraction(x)
    if x.denominator == 1:
        return str(x.numerator)
    return f"{x.numerator}/{x.denominator}"


def half_up(x: Fraction) -> int:
    """Nearest integer, halves rounded up (Python's round() rounds halves to even)."""
    return math.floor(x + Fraction(1, 2))


def money(cents: int) -> str:
    return f"${cents // 100}.{cents % 100:02d}"


def decimal(x: Fraction, places: int = 2) -> str:
    """``x`` rounded half up to ``places`` decimals, without float error."""
    scaled = x * 10**places
    q = math.floor(scaled + Fraction(1, 2))
    sign = "-" if q < 0 else ""
    q = abs(q)
    whole, frac = divmod(q, 10**places)
    return f"{sign}{whole}.{frac:0{places}d}" if places else f"{sign}{whole}"


def num(x: Fraction) -> str:
    """An integer plainly, anything else to two decimals."""
    return str(x.numerator) if x.denominator == 1 else decimal(x)


def a_an(noun: str) -> str:
    return f"{'an' if noun[0] in 'aeiou' else 'a'} {noun}"


def is_exact(x: Fraction, places: int = 2) -> bool:
    return (x * 10**places).denominator == 1


def eq(x: Fraction, places: int = 2) -> str:
    """"= 14.40" when the decimal is exact, "≈ 14.29" when it is rounded."""
    return f"{'=' if is_exact(x, places) else '≈'} {decimal(x, places)}"


# ---------------------------------------------------------------- arithmetic


_PRECEDENCE = {"+": 1, "-": 1, "×": 2, "÷": 2}


def _apply(a: Fraction, op: str, b: Fraction) -> Fraction:
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "×":
        return a * b
    return a / b


def reduce_once(tokens: list) -> list:
    """One step of the school rule: innermost brackets first, then × ÷ left to right, then + - left to right."""
    # Find the innermost bracket group (no bracket inside it).
    start, end = None, None
    for i, t in enumerate(tokens):
        if t == "(":
            start = i
        elif t == ")":
            end = i
            break
    lo, hi = (start + 1, end) if end is not None else (0, len(tokens))
    inner = tokens[lo:hi]
    if len(inner) == 1:  # "(5)" -> "5"
        return tokens[:start] + inner + tokens[end + 1:]
    ops = [i for i in range(1, len(inner), 2) if _PRECEDENCE[inner[i]] == 2] or list(range(1, len(inner), 2))
    i = ops[0]
    value = _apply(inner[i - 1], inner[i], inner[i + 1])
    inner = inner[:i - 1] + [value] + inner[i + 2:]
    if end is not None and len(inner) == 1:
        return tokens[:start] + inner + tokens[end + 1:]
    return tokens[:lo] + inner + tokens[hi:]


def render(tokens: list) -> str:
    text = " ".join(fmt(t) if isinstance(t, Fraction) else t for t in tokens)
    return text.replace("( ", "(").replace(" )", ")")


def evaluate_steps(tokens: list) -> list[list]:
    """Every intermediate expression, from ``tokens`` to a single number."""
    steps = [tokens]
    while len(steps[-1]) > 1:
        steps.append(reduce_once(steps[-1]))
    return steps


def _random_expression(d: Draws) -> list:
    n = d.int(2, 4)  # operators
    tokens: list = [Fraction(d.int(2, 60))]
    for _ in range(n):
        op = d.choice(("+", "-", "×", "÷", "×", "+"))
        if op == "×":
            tokens += [op, Fraction(d.int(2, 12))]
        elif op == "÷":
            tokens += [op, Fraction(d.choice((2, 3, 4, 5, 6, 8, 10)))]
        else:
            tokens += [op, Fraction(d.int(1, 50))]
    if d.int(0, 1) and len(tokens) >= 5:  # bracket one "a op b" pair of numbers
        i = 2 * d.int(0, (len(tokens) - 3) // 2)
        tokens = tokens[:i] + ["("] + tokens[i:i + 3] + [")"] + tokens[i + 3:]
    return tokens


def order_of_operations(d: Draws) -> tuple[str, str]:
    # Resample until every step stays a whole number >= 0 (school convention).
    while True:
        tokens = _random_expression(d)
        steps = evaluate_steps(tokens)
        if all(isinstance(t, str) or (t.denominator == 1 and t >= 0) for s in steps for t in s):
            break
    lines = [f"Evaluate {render(tokens)}.", "",
             "Solution: work inside brackets first, then multiply and divide from left to right, "
             "then add and subtract from left to right."]
    lines.append(render(tokens))
    lines += [f"= {render(step)}" for step in steps[1:]]
    answer = fmt(steps[-1][0])
    return "\n".join(lines), answer


def long_multiplication(d: Draws) -> tuple[str, str]:
    a, b = d.int(12, 9999), d.int(12, 99)
    tens, ones = b // 10 * 10, b % 10
    lines = [f"Compute {a} × {b} by long multiplication.", "",
             f"Solution: split {b} into {tens} + {ones}."]
    lines.append(f"{a} × {tens} = {a * tens}")
    if ones:
        lines.append(f"{a} × {ones} = {a * ones}")
        lines.append(f"Add the partial products: {a * tens} + {a * ones} = {a * b}.")
    return "\n".join(lines), str(a * b)


def long_division(d: Draws) -> tuple[str, str]:
    divisor = d.int(3, 29)
    dividend = d.int(divisor * 10, 9999)
    q, r = divmod(dividend, divisor)
    lines = [f"Divide {dividend} by {divisor}. Give the quotient and the remainder.", "", "Solution:"]
    # Digit-by-digit long division, as written on paper.
    rem, started = 0, False
    for digit in str(dividend):
        rem = rem * 10 + int(digit)
        if rem >= divisor or started:
            started = True
            qd = rem // divisor
            lines.append(f"{divisor} goes into {rem} {qd} time{'s' if qd != 1 else ''} "
                         f"({divisor} × {qd} = {divisor * qd}), leaving {rem - divisor * qd}.")
            rem -= divisor * qd
    lines.append(f"So {dividend} ÷ {divisor} = {q} remainder {r}.")
    lines.append(f"Check: {divisor} × {q} + {r} = {divisor * q} + {r} = {dividend}.")
    return "\n".join(lines), f"{q} remainder {r}"


# ---------------------------------------------------------------- fractions


def _simplify_line(num: int, den: int) -> str:
    g = math.gcd(num, den)
    if g == 1:
        return f"{num}/{den} is already in lowest terms."
    return f"Divide numerator and denominator by {g}: {num}/{den} = {num // g}/{den // g}."


def _mixed(x: Fraction) -> str:
    if x.denominator == 1 or abs(x) < 1:
        return fmt(x)
    whole = int(abs(x)) * (1 if x > 0 else -1)
    rest = abs(x - whole)
    return f"{whole} {rest.numerator}/{rest.denominator}"


def fraction_arithmetic(d: Draws) -> tuple[str, str]:
    b, dd = d.int(2, 12), d.int(2, 12)
    a, c = d.int(1, 2 * b - 1), d.int(1, 2 * dd - 1)
    while math.gcd(a, b) != 1:  # the question states fractions in lowest terms
        a = d.int(1, 2 * b - 1)
    while math.gcd(c, dd) != 1:
        c = d.int(1, 2 * dd - 1)
    x, y = Fraction(a, b), Fraction(c, dd)
    op = d.choice(("+", "-", "×", "÷"))
    if op == "-" and x < y:
        a, b, c, dd, x, y = c, dd, a, b, y, x
    lines = [f"Calculate {a}/{b} {op} {c}/{dd}. Write the answer in lowest terms.", "", "Solution:"]
    if op in "+-":
        lcd = b * dd // math.gcd(b, dd)
        na, nc = a * (lcd // b), c * (lcd // dd)
        lines.append(f"The least common denominator of {b} and {dd} is {lcd}.")
        lines.append(f"{a}/{b} = {na}/{lcd} and {c}/{dd} = {nc}/{lcd}.")
        num = na + nc if op == "+" else na - nc
        lines.append(f"{na}/{lcd} {op} {nc}/{lcd} = {num}/{lcd}.")
        den = lcd
    elif op == "×":
        num, den = a * c, b * dd
        lines.append(f"Multiply the numerators and the denominators: ({a} × {c})/({b} × {dd}) = {num}/{den}.")
    else:
        num, den = a * dd, b * c
        lines.append(f"Dividing by {c}/{dd} is multiplying by its reciprocal {dd}/{c}.")
        lines.append(f"{a}/{b} × {dd}/{c} = ({a} × {dd})/({b} × {c}) = {num}/{den}.")
    result = Fraction(num, den)
    if num == 0:
        lines.append("The result is 0.")
    else:
        lines.append(_simplify_line(num, den))
        if result.denominator != 1 and abs(result) > 1:
            lines.append(f"As a mixed number: {fmt(result)} = {_mixed(result)}.")
    return "\n".join(lines), fmt(result)


# ---------------------------------------------------------------- algebra


def _term(coef: int, var: str = "x") -> str:
    if coef == 1:
        return var
    if coef == -1:
        return f"-{var}"
    return f"{coef}{var}"


def _signed(v: int) -> str:
    return f"+ {v}" if v >= 0 else f"- {-v}"


def _move(b: int) -> str:
    """The step that removes the constant ``b`` from the left side."""
    return f"Subtract {b} from" if b >= 0 else f"Add {-b} to"


def linear_equation(d: Draws) -> tuple[str, str]:
    x = d.int(-12, 15)
    kind = d.int(0, 2)
    if kind == 0:  # ax + b = c
        a, b = d.nonzero(-9, 12), d.int(-30, 30)
        c = a * x + b
        lines = [f"Solve for x: {_term(a)} {_signed(b)} = {c}.", "", "Solution:"]
        lines.append(f"{_move(b)} both sides: {_term(a)} = {c} {'-' if b >= 0 else '+'} {abs(b)} = {c - b}.")
        lines.append(f"Divide both sides by {a}: x = {c - b}/{_paren(a)} = {x}." if a != 1 else f"So x = {x}.")
        lines.append(f"Check: {a} × {_paren(x)} {_signed(b)} = {a * x} {_signed(b)} = {c}.")
    elif kind == 1:  # a(x + b) = c
        a, b = d.nonzero(2, 9), d.nonzero(-10, 10)
        c = a * (x + b)
        lines = [f"Solve for x: {a}(x {_signed(b)}) = {c}.", "", "Solution:"]
        lines.append(f"Divide both sides by {a}: x {_signed(b)} = {c}/{a} = {x + b}.")
        lines.append(f"{'Subtract' if b > 0 else 'Add'} {abs(b)} {'from' if b > 0 else 'to'} both sides: "
                     f"x = {x + b} {'-' if b > 0 else '+'} {abs(b)} = {x}.")
        lines.append(f"Check: {a}({x} {_signed(b)}) = {a} × {_paren(x + b)} = {c}.")
    else:  # ax + b = cx + e
        a = d.nonzero(-9, 12)
        c = d.nonzero(-9, 12)
        while c == a:
            c = d.nonzero(-9, 12)
        b = d.int(-30, 30)
        e = (a - c) * x + b
        lines = [f"Solve for x: {_term(a)} {_signed(b)} = {_term(c)} {_signed(e)}.", "", "Solution:"]
        lines.append(f"Collect the x terms on the left: {_term(a)} - "
                     f"{_term(c) if c > 0 else '(' + _term(c) + ')'} = {_term(a - c)}, "
                     f"so {_term(a - c)} {_signed(b)} = {e}.")
        lines.append(f"{_move(b)} both sides: {_term(a - c)} = {e} {'-' if b >= 0 else '+'} {abs(b)} = {e - b}.")
        lines.append(f"Divide by {a - c}: x = {e - b}/{_paren(a - c)} = {x}." if a - c != 1 else f"So x = {x}.")
        lines.append(f"Check: left side {a} × {_paren(x)} {_signed(b)} = {a * x + b}; "
                     f"right side {c} × {_paren(x)} {_signed(e)} = {c * x + e}.")
    return "\n".join(lines), f"x = {x}"


def _paren(v: int) -> str:
    return f"({v})" if v < 0 else str(v)


def _combo(a: int, b: int) -> str:
    """``a·x + b·y`` as written by hand, e.g. "3x - y"."""
    return f"{_term(a)} {'+' if b > 0 else '-'} {_term(abs(b), 'y')}"


def linear_system(d: Draws) -> tuple[str, str]:
    x, y = d.int(-9, 12), d.int(-9, 12)
    while True:
        a, b, c, e = d.nonzero(-6, 7), d.nonzero(-6, 7), d.nonzero(-6, 7), d.nonzero(-6, 7)
        if a * e - b * c != 0:
            break
    r1, r2 = a * x + b * y, c * x + e * y
    det, rhs = a * e - b * c, r2 * a - r1 * c
    lines = ["Solve the system of equations:", f"  {_combo(a, b)} = {r1}", f"  {_combo(c, e)} = {r2}", "",
             "Solution: eliminate x.",
             f"Multiply the first equation by {c} and the second by {a}:",
             f"  {_combo(a * c, b * c)} = {r1 * c}",
             f"  {_combo(a * c, a * e)} = {r2 * a}",
             f"Subtract the first from the second: {_term(det, 'y')} = {rhs}, so y = {rhs}/{det} = {y}.",
             f"Substitute y = {y} into the first equation: {_term(a)} {_signed(b * y)} = {r1}, "
             f"so {_term(a)} = {r1 - b * y} and x = {x}.",
             f"Check with the second equation: {c} × {_paren(x)} {'+' if e > 0 else '-'} {abs(e)} × {_paren(y)} "
             f"= {r2}."]
    return "\n".join(lines), f"x = {x}, y = {y}"


# ---------------------------------------------------------------- percentages


def percentages(d: Draws) -> tuple[str, str]:
    kind = d.int(0, 3)
    if kind == 0:
        p, n = d.choice((5, 10, 12, 15, 20, 25, 30, 40, 45, 60, 75, 80)), d.int(2, 80) * 20
        v = Fraction(p * n, 100)
        text = (f"What is {p}% of {n}?\n\nSolution: {p}% means {p}/100.\n"
                f"{p}/100 × {n} = {p * n}/100 {eq(v) if v.denominator != 1 else '= ' + fmt(v)}.")
        return text, fmt(v) if v.denominator == 1 else decimal(v)
    if kind == 1:
        old, p = d.int(4, 90) * 10, d.choice((10, 15, 20, 25, 30, 35, 40, 50))
        up = d.int(0, 1) == 1
        change = Fraction(old * p, 100)
        new = old + change if up else old - change
        word = "increases" if up else "decreases"
        text = (f"A quantity of {old} {word} by {p}%. What is the new value?\n\n"
                f"Solution: the change is {p}% of {old} = {p}/100 × {old} = {num(change)}.\n"
                f"New value = {old} {'+' if up else '-'} {num(change)} = {num(new)}.\n"
                f"Equivalently, {old} × {decimal(Fraction(100 + p if up else 100 - p, 100))} = {num(new)}.")
        return text, num(new)
    if kind == 2:
        price, disc, tax = d.int(10, 400) * 100 + d.choice((0, 50, 99, 25)), d.choice((10, 15, 20, 25, 30)), \
            d.choice((5, 6, 8, 10))
        item = d.choice(ITEMS)[0]
        sale = half_up(Fraction(price * (100 - disc), 100))  # cents, rounded like a till does
        total = half_up(Fraction(sale * (100 + tax), 100))
        text = (f"{a_an(item).capitalize()} costs {money(price)}. It is on sale for {disc}% off, and then a {tax}% sales tax "
                f"is added. What is the final price?\n\n"
                f"Solution: the discount is {disc}% of {money(price)} = "
                f"{money(half_up(Fraction(price * disc, 100)))}.\n"
                f"Sale price = {money(price)} × {decimal(Fraction(100 - disc, 100))} = {money(sale)}.\n"
                f"With tax: {money(sale)} × {decimal(Fraction(100 + tax, 100))} = "
                f"{money(total)} (to the nearest cent).")
        return text, money(total)
    whole = d.int(2, 40) * 5
    part = d.int(1, whole)
    pct = Fraction(part * 100, whole)
    text = (f"What percent of {whole} is {part}?\n\n"
            f"Solution: divide the part by the whole and multiply by 100.\n"
            f"{part}/{whole} × 100 = {fmt(Fraction(part, whole))} × 100 {eq(pct)}%.")
    return text, f"{decimal(pct)}%" if is_exact(pct) else f"about {decimal(pct)}%"


# ---------------------------------------------------------------- geometry

_TRIPLES = ((3, 4, 5), (5, 12, 13), (8, 15, 17), (7, 24, 25), (20, 21, 29))


def geometry(d: Draws) -> tuple[str, str]:
    kind = d.int(0, 5)
    if kind == 0:
        w, h = d.int(2, 40), d.int(2, 40)
        text = (f"A rectangle is {w} cm wide and {h} cm long. Find its area and its perimeter.\n\n"
                f"Solution: area = width × length = {w} × {h} = {w * h} square centimetres.\n"
                f"Perimeter = 2 × (width + length) = 2 × ({w} + {h}) = 2 × {w + h} = {2 * (w + h)} cm.")
        return text, f"area {w * h} cm², perimeter {2 * (w + h)} cm"
    if kind == 1:
        base, height = d.int(2, 30) * 2, d.int(2, 30)
        area = base * height // 2
        text = (f"A triangle has a base of {base} m and a height of {height} m. What is its area?\n\n"
                f"Solution: area = 1/2 × base × height = 1/2 × {base} × {height} = {base * height}/2 = {area}.\n"
                f"The area is {area} square metres.")
        return text, f"{area} m²"
    if kind == 2:
        r = d.int(1, 25)
        pi = Fraction(314, 100)
        area, circ = pi * r * r, 2 * pi * r
        text = (f"A circle has a radius of {r} cm. Using π ≈ 3.14, find its area and circumference.\n\n"
                f"Solution: area = π r² ≈ 3.14 × {r}² = 3.14 × {r * r} {eq(area)} cm².\n"
                f"Circumference = 2 π r ≈ 2 × 3.14 × {r} {eq(circ)} cm.\n"
                f"(Exactly: area = {r * r}π cm² and circumference = {2 * r}π cm.)")
        return text, f"area ≈ {decimal(area)} cm², circumference ≈ {decimal(circ)} cm"
    if kind == 3:
        a, b, c = d.choice(_TRIPLES)
        k = d.int(1, 6)
        a, b, c = a * k, b * k, c * k
        text = (f"A right triangle has legs of length {a} and {b}. How long is the hypotenuse?\n\n"
                f"Solution: by the Pythagorean theorem, c² = a² + b².\n"
                f"c² = {a}² + {b}² = {a * a} + {b * b} = {c * c}.\n"
                f"c = √{c * c} = {c}.")
        return text, str(c)
    if kind == 4:
        l, w, h = d.int(2, 20), d.int(2, 20), d.int(2, 20)
        surface = 2 * (l * w + l * h + w * h)
        text = (f"A box measures {l} cm by {w} cm by {h} cm. Find its volume and its surface area.\n\n"
                f"Solution: volume = length × width × height = {l} × {w} × {h} = {l * w * h} cm³.\n"
                f"Surface area = 2 × ({l} × {w} + {l} × {h} + {w} × {h}) = 2 × ({l * w} + {l * h} + {w * h}) "
                f"= 2 × {l * w + l * h + w * h} = {surface} cm².")
        return text, f"volume {l * w * h} cm³, surface area {surface} cm²"
    a1 = d.int(20, 110)
    a2 = d.int(10, 170 - a1)
    a3 = 180 - a1 - a2
    text = (f"Two angles of a triangle measure {a1}° and {a2}°. What is the third angle?\n\n"
            f"Solution: the angles of a triangle add up to 180°.\n"
            f"Third angle = 180° - {a1}° - {a2}° = {a3}°.")
    return text, f"{a3}°"


# ---------------------------------------------------------------- statistics and number theory


def statistics(d: Draws) -> tuple[str, str]:
    n = d.int(5, 9)
    values = [d.int(1, 30) for _ in range(n)]
    s = sorted(values)
    mean = Fraction(sum(values), n)
    median = Fraction(s[n // 2]) if n % 2 else Fraction(s[n // 2 - 1] + s[n // 2], 2)
    counts = {v: values.count(v) for v in s}
    top = max(counts.values())
    modes = [v for v in counts if counts[v] == top]
    listing = ", ".join(map(str, values))
    lines = [f"Find the mean, median, mode and range of: {listing}.", "",
             f"Solution: in order, the values are {', '.join(map(str, s))}.",
             f"Mean = ({' + '.join(map(str, values))})/{n} = {sum(values)}/{n} "
             f"{'= ' + fmt(mean) if mean.denominator == 1 else eq(mean)}."]
    if n % 2:
        lines.append(f"There are {n} values, so the median is the middle (value number {n // 2 + 1}): {s[n // 2]}.")
    else:
        lines.append(f"There are {n} values, so the median is the mean of values {n // 2} and {n // 2 + 1}: "
                     f"({s[n // 2 - 1]} + {s[n // 2]})/2 = {decimal(median, 1)}.")
    if top == 1:
        lines.append("Every value occurs once, so there is no mode.")
        mode_text = "none"
    else:
        mode_text = " and ".join(map(str, modes))
        lines.append(f"The mode is {mode_text} (occurs {top} times).")
    lines.append(f"Range = largest - smallest = {s[-1]} - {s[0]} = {s[-1] - s[0]}.")
    mean_text = fmt(mean) if mean.denominator == 1 else f"{fmt(mean)} {eq(mean)}"
    median_text = fmt(median) if median.denominator == 1 else decimal(median, 1)
    return "\n".join(lines), f"mean {mean_text}, median {median_text}, mode {mode_text}, range {s[-1] - s[0]}"


def prime_factors(n: int) -> list[int]:
    out, p = [], 2
    while p * p <= n:
        while n % p == 0:
            out.append(p)
            n //= p
        p += 1
    if n > 1:
        out.append(n)
    return out


def _factor_text(n: int) -> str:
    f = prime_factors(n)
    parts = [f"{p}^{f.count(p)}" if f.count(p) > 1 else str(p) for p in sorted(set(f))]
    return " × ".join(parts)


def gcd_lcm(d: Draws) -> tuple[str, str]:
    g = d.int(2, 12)
    a, b = g * d.int(2, 15), g * d.int(2, 15)
    while a == b:
        b = g * d.int(2, 15)
    gcd, lcm = math.gcd(a, b), a * b // math.gcd(a, b)
    text = (f"Find the greatest common divisor and the least common multiple of {a} and {b}.\n\n"
            f"Solution: factor both numbers into primes.\n"
            f"{a} = {_factor_text(a)}\n{b} = {_factor_text(b)}\n"
            f"The GCD takes each common prime with the smaller power: GCD = {gcd}.\n"
            f"The LCM takes each prime with the larger power: LCM = {lcm}.\n"
            f"Check: GCD × LCM = {gcd} × {lcm} = {gcd * lcm} = {a} × {b}.")
    return text, f"GCD {gcd}, LCM {lcm}"


def powers_and_roots(d: Draws) -> tuple[str, str]:
    kind = d.int(0, 2)
    if kind == 0:
        base, e1, e2 = d.int(2, 5), d.int(2, 5), d.int(1, 4)
        value = base ** (e1 + e2)
        text = (f"Simplify {base}^{e1} × {base}^{e2} and evaluate it.\n\n"
                f"Solution: when multiplying powers with the same base, add the exponents.\n"
                f"{base}^{e1} × {base}^{e2} = {base}^({e1} + {e2}) = {base}^{e1 + e2} = {value}.")
        return text, str(value)
    if kind == 1:
        r1, r2 = d.int(2, 15), d.int(2, 15)
        text = (f"Evaluate √{r1 * r1} + √{r2 * r2} × 2.\n\n"
                f"Solution: √{r1 * r1} = {r1} because {r1} × {r1} = {r1 * r1}, "
                f"and √{r2 * r2} = {r2} because {r2} × {r2} = {r2 * r2}.\n"
                f"Multiply before adding: {r1} + {r2} × 2 = {r1} + {2 * r2} = {r1 + 2 * r2}.")
        return text, str(r1 + 2 * r2)
    mantissa, exp = d.int(11, 99), d.int(3, 8)
    number = mantissa * 10 ** (exp - 1)
    text = (f"Write {number:,} in scientific notation.\n\n"
            f"Solution: move the decimal point {exp} places to the left so that one nonzero digit "
            f"is before it: {number:,} = {mantissa // 10}.{mantissa % 10} × 10^{exp}.")
    return text, f"{mantissa // 10}.{mantissa % 10} × 10^{exp}"


# ---------------------------------------------------------------- word problems


def word_problem(d: Draws) -> tuple[str, str]:
    kind = d.int(0, 5)
    name, other = d.choice(NAMES), d.choice(NAMES)
    while other == name:
        other = d.choice(NAMES)
    if kind == 0:
        speed, hours = d.int(4, 24) * 5, d.int(2, 9)
        minutes = d.choice((0, 15, 30, 45))
        t = Fraction(hours * 60 + minutes, 60)
        dist = speed * t
        text = (f"{name} drives at a steady {speed} km/h for {hours} hours and {minutes} minutes. "
                f"How far does {name} travel?\n\n"
                f"Solution: {minutes} minutes is {minutes}/60 {eq(Fraction(minutes, 60))} hours, "
                f"so the time is {num(t)} hours.\n"
                f"Distance = speed × time = {speed} × {num(t)} = {num(dist)} km.")
        return text, f"{num(dist)} km"
    if kind == 1:
        many, n = d.choice(ITEMS)[1], d.int(2, 12)
        price = d.int(1, 9) * 100 + d.choice((0, 25, 50, 75, 99))
        paid = (n * price // 1000 + 1) * 1000 + d.choice((0, 1000))
        cost = n * price
        text = (f"{name} buys {n} {many} at {money(price)} each and pays with {money(paid)}. "
                f"How much change does {name} get?\n\n"
                f"Solution: the total cost is {n} × {money(price)} = {money(cost)}.\n"
                f"Change = {money(paid)} - {money(cost)} = {money(paid - cost)}.")
        return text, money(paid - cost)
    if kind == 2:
        people, each = d.int(3, 12), d.int(4, 30)
        extra = d.int(0, people - 1)
        total = people * each + extra
        many = d.choice(ITEMS)[1]
        text = (f"{total} {many} are shared equally among {people} friends. How many does each friend get, "
                f"and how many are left over?\n\n"
                f"Solution: divide {total} by {people}: {people} × {each} = {people * each}, "
                f"and {total} - {people * each} = {extra}.\n"
                f"Each friend gets {each} {many} and {extra} {'is' if extra == 1 else 'are'} left over.")
        return text, f"{each} each, {extra} left over"
    if kind == 3:
        a, b = d.choice(((2, 3), (3, 6), (4, 12), (6, 3), (10, 15), (5, 20), (12, 4), (6, 12), (8, 24)))
        together = Fraction(a * b, a + b)
        text = (f"{name} can paint a fence in {a} hours and {other} can paint it in {b} hours. "
                f"How long does it take them working together?\n\n"
                f"Solution: in one hour {name} paints 1/{a} of the fence and {other} paints 1/{b}.\n"
                f"Together they paint 1/{a} + 1/{b} = {fmt(Fraction(1, a) + Fraction(1, b))} of the fence "
                f"per hour.\n"
                f"Time = 1 ÷ {fmt(Fraction(1, a) + Fraction(1, b))} = {fmt(together)} hours"
                + (f" {eq(together)} hours." if together.denominator != 1 else "."))
        return text, f"{fmt(together)} hours"
    if kind == 4:
        r1, r2 = d.int(1, 7), d.int(1, 7)
        unit = d.int(2, 20)
        total = (r1 + r2) * unit
        text = (f"{name} and {other} share {money(total * 100)} in the ratio {r1}:{r2}. "
                f"How much does each receive?\n\n"
                f"Solution: there are {r1} + {r2} = {r1 + r2} parts in total.\n"
                f"One part is {money(total * 100)} ÷ {r1 + r2} = {money(unit * 100)}.\n"
                f"{name} receives {r1} × {money(unit * 100)} = {money(r1 * unit * 100)} and "
                f"{other} receives {r2} × {money(unit * 100)} = {money(r2 * unit * 100)}.")
        return text, f"{money(r1 * unit * 100)} and {money(r2 * unit * 100)}"
    young, gap, years = d.int(4, 20), d.int(2, 35), d.int(2, 15)
    old = young + gap
    text = (f"{name} is {gap} years older than {other}. In {years} years their ages will add up to "
            f"{young + old + 2 * years}. How old is {other} now?\n\n"
            f"Solution: let {other}'s age now be a. Then {name} is a + {gap}.\n"
            f"In {years} years: (a + {years}) + (a + {gap} + {years}) = {young + old + 2 * years}.\n"
            f"2a + {gap + 2 * years} = {young + old + 2 * years}, so 2a = {2 * young} and a = {young}.\n"
            f"{other} is {young} and {name} is {old}.")
    return text, f"{young}"


GENERATORS: tuple[tuple[str, Callable[[Draws], tuple[str, str]]], ...] = (
    ("order of operations", order_of_operations),
    ("long multiplication", long_multiplication),
    ("long division", long_division),
    ("fractions", fraction_arithmetic),
    ("linear equations", linear_equation),
    ("systems of equations", linear_system),
    ("percentages", percentages),
    ("geometry", geometry),
    ("statistics", statistics),
    ("factors and multiples", gcd_lcm),
    ("powers and roots", powers_and_roots),
    ("word problems", word_problem),
)


def problem(seed: int, key: str) -> str:
    """One problem with its worked solution and answer; a pure function of ``(seed, key)``."""
    d = Draws(seed, key)
    topic, generate = GENERATORS[d.int(0, len(GENERATORS) - 1)]
    body, answer = generate(d)
    return f"Problem ({topic}). {body}\n\nAnswer: {answer}"


def exercise_set(seed: int, index: int) -> str:
    """Document ``index``: an exercise set of 2-4 worked problems (one problem alone is often <= 200 chars)."""
    count = Draws(seed, f"set:{index}").int(2, 4)
    problems_text = [problem(seed, f"{index}.{j}") for j in range(count)]
    return f"Exercise set {index + 1}\n\n" + "\n\n".join(
        f"{j + 1}. {text}" for j, text in enumerate(problems_text)) + "\n"


def exercise_sets(seed: int) -> Iterator[str]:
    """The endless, deterministic stream of exercise sets for ``seed``."""
    index = 0
    while True:
        yield exercise_set(seed, index)
        index += 1
