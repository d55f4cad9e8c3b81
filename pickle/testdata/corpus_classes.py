"""Classes that gen_corpus.py pickles. The oracle loads their pickles for real (find_class imports
this module), so it must sit next to gen_corpus.py; nothing here is hostile."""
import collections
import copyreg
import dataclasses
import enum


@dataclasses.dataclass
class Point:
    x: int
    y: float
    tags: list = dataclasses.field(default_factory=list)


@dataclasses.dataclass(eq=True, order=True, frozen=True)
class NodeDesc:
    """Shaped like torch's _NodeDesc: frozen, ordered, used as dict keys and set items."""
    addr: str
    pid: int
    local_id: int


Pair = collections.namedtuple("Pair", ["left", "right"])


class Color(enum.Enum):
    RED = 1
    GREEN = "green"


class Level(enum.IntEnum):
    LOW = 1
    HIGH = 9


class Plain:
    def __init__(self):
        self.a = 1
        self.b = "two"


class Slotted:
    __slots__ = ("a", "b")

    def __init__(self):
        self.a = 1
        self.b = [2]


class WithState:
    def __init__(self, n):
        self.n = n
        self.cache = {"skip": True}

    def __getstate__(self):
        return {"n": self.n}

    def __setstate__(self, state):
        self.n = state["n"]
        self.cache = {}


class WithReduce:
    def __init__(self, a, b):
        self.a, self.b = a, b

    def __reduce__(self):
        return (WithReduce, (self.a, self.b))


def _rebuild_ex(cls, value):
    obj = cls.__new__(cls)
    obj.value = value
    return obj


class WithReduceEx:
    def __init__(self, value):
        self.value = value

    def __reduce_ex__(self, protocol):
        return (_rebuild_ex, (WithReduceEx, self.value), None, None, None)


class WithNewArgs:
    def __new__(cls, a, *, b=0):
        self = object.__new__(cls)
        self.a, self.b = a, b
        return self

    def __getnewargs_ex__(self):
        return (self.a,), {"b": self.b}


class ListSub(list):
    pass


class DictSub(dict):
    pass


class Outer:
    class Inner:
        class Deepest:
            def __init__(self):
                self.v = 3

        def __init__(self):
            self.deep = Outer.Inner.Deepest()


class OldStyle:
    """Pickled through copyreg._reconstructor below protocol 2 (no __reduce_ex__ override)."""

    def __init__(self):
        self.x = [1, 2]


class WithInitArgs:
    """Instantiated by INST/OBJ with arguments: __getinitargs__ is honoured there."""

    def __init__(self, a=0):
        self.a = a

    def __getinitargs__(self):
        return (self.a,)


copyreg.constructor  # imported for the side effect of copyreg being loaded; silences linters
