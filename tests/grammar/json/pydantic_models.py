"""Pydantic v2 models with the field types LangChain users pass (`with_structured_output` sends
`Model.model_json_schema()`): one or a few field kinds per model, so a failure names its type."""
from __future__ import annotations

import datetime as dt
import enum
from decimal import Decimal
from typing import Annotated, Literal, Optional, Union
from uuid import UUID

from pydantic import AnyUrl, BaseModel, ConfigDict, EmailStr, Field, HttpUrl


class Tags(BaseModel):
    tags: set[str]


class FrozenIds(BaseModel):
    ids: frozenset[int]


class BoundedSet(BaseModel):
    codes: set[Annotated[int, Field(ge=0, le=9)]] = Field(min_length=3, max_length=5)


class ShortWords(BaseModel):
    words: set[Annotated[str, Field(max_length=2, pattern=r"^[a-c]+$")]] = Field(min_length=4)


class FloatSet(BaseModel):
    weights: frozenset[float]


class Color(str, enum.Enum):
    RED = "red"
    GREEN = "green"
    BLUE = "blue"


class Priority(enum.IntEnum):
    LOW = 1
    MEDIUM = 2
    HIGH = 3


class ColorSet(BaseModel):
    colors: set[Color]


class Point(BaseModel):
    xy: tuple[int, int]
    label: tuple[str, bool, float]


class Series(BaseModel):
    values: tuple[float, ...]
    names: tuple[str, ...] = ()


class Counts(BaseModel):
    counts: dict[str, int]


class Price(BaseModel):
    amount: Decimal


class Money(BaseModel):
    amount: Decimal = Field(ge=0, le=1000, max_digits=6, decimal_places=2)


class Event(BaseModel):
    at: dt.datetime
    day: dt.date
    start: dt.time


class Span(BaseModel):
    duration: dt.timedelta


class Ident(BaseModel):
    id: UUID


class Site(BaseModel):
    url: HttpUrl
    docs: AnyUrl


class Contact(BaseModel):
    email: EmailStr


class Ticket(BaseModel):
    color: Color
    priority: Priority


class Modes(BaseModel):
    mode: Literal["fast", "slow"]
    level: Literal[1, 2, 3]
    flag: Literal[True]


class Cat(BaseModel):
    pet_type: Literal["cat"]
    meows: int


class Dog(BaseModel):
    pet_type: Literal["dog"]
    barks: float


class Lizard(BaseModel):
    pet_type: Literal["reptile", "lizard"]
    scales: bool


class Owner(BaseModel):
    pet: Union[Cat, Dog, Lizard] = Field(discriminator="pet_type")


class Shelter(BaseModel):
    pets: list[Annotated[Union[Cat, Dog], Field(discriminator="pet_type")]] = Field(max_length=3)


class TreeNode(BaseModel):
    value: int
    children: list[TreeNode] = Field(default_factory=list, max_length=2)


class LinkedNode(BaseModel):
    name: str = Field(max_length=8)
    next: Optional[LinkedNode] = None


class Profile(BaseModel):
    nickname: Optional[str] = None
    age: Optional[int] = None
    score: float | None


class Address(BaseModel):
    street: str
    city: str
    zip: str = Field(pattern=r"^[0-9]{5}$")


class Person(BaseModel):
    name: str
    home: Address
    work: Optional[Address] = None


class LineItem(BaseModel):
    sku: str = Field(min_length=3, max_length=8)
    quantity: int = Field(gt=0, lt=100)


class Order(BaseModel):
    items: list[LineItem] = Field(min_length=1, max_length=4)


class Measurements(BaseModel):
    ratio: float = Field(ge=0.0, le=1.0)
    count: int = Field(gt=-5, lt=5)
    step: int = Field(multiple_of=5, ge=0, le=100)
    fine: float = Field(multiple_of=0.25, gt=0, lt=10)


class Texts(BaseModel):
    code: str = Field(min_length=2, max_length=4)
    slug: str = Field(pattern=r"^[a-z][a-z0-9-]{0,10}$")
    note: str = Field(max_length=20)


class Lists(BaseModel):
    few: list[int] = Field(min_length=1, max_length=3)
    names: list[str] = Field(default_factory=list, max_length=2)


class Defaults(BaseModel):
    title: str = "untitled"
    retries: int = 3
    verbose: bool = False
    ratio: float = 0.5


class Aliased(BaseModel):
    model_config = ConfigDict(populate_by_name=True)
    user_name: str = Field(alias="userName")
    user_id: int = Field(alias="ID")


class Directory(BaseModel):
    people: dict[str, Address]


class Mixed(BaseModel):
    value: Union[int, str]
    maybe: Optional[list[Optional[int]]] = None


class Flags(BaseModel):
    enabled: bool
    tags: list[Color] = Field(default_factory=list)


class Network(BaseModel):
    ip: Annotated[str, Field(pattern=r"^[0-9]{1,3}(\.[0-9]{1,3}){3}$")]
    port: int = Field(ge=1, le=65535)


class Catalog(BaseModel):
    skus: set[str] = Field(max_length=4)
    prices: dict[str, float] = Field(max_length=2)
    released: Optional[dt.date] = None


class Schedule(BaseModel):
    slots: list[tuple[dt.time, dt.time]] = Field(max_length=2)
    owner: Ident


MODELS: list[type[BaseModel]] = [
    Tags, FrozenIds, BoundedSet, ShortWords, FloatSet, ColorSet, Point, Series, Counts, Price, Money,
    Event, Span, Ident, Site, Contact, Ticket, Modes, Owner, Shelter, TreeNode, LinkedNode, Profile,
    Person, Order, Measurements, Texts, Lists, Defaults, Aliased, Directory, Mixed, Flags, Network,
    Catalog, Schedule,
]
