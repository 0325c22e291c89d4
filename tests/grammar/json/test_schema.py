"""JSON Schema → regex (gdserve.grammar.json.schema): the schemas/ corpus, soundness under random
mutation, MaskBench's dev split, outlines-core compatibility, and keyword-level behaviour (the
JSON-Schema-Test-Suite has its own file, test_schema_test_suite.py)."""

import copy
import datetime
import json
import random
import re
import time
from pathlib import Path

import jsonschema
import pytest

from gdserve.grammar.errors import GrammarError, RecursiveSchemaError, RegexTooLargeError
from gdserve.grammar.json.schema import (
    DEFAULT_WS_BREAK,
    compile_json_schema,
    schema_to_regex,
)
from tests.helpers import CONFORMANCE, require_corpus

ROOT = Path(__file__).resolve().parents[3]
SCHEMAS = ROOT / "schemas"
MASKBENCH = CONFORMANCE / "maskbench-dev"

UUID = "3f2b8c1e-9d4a-4b6e-8f01-2a3b4c5d6e7f"

CASES = {
    "person": (
        [
            {"name": "Ada Lovelace", "age": 36},
            {"name": "Bob", "age": 0, "email": "bob@example.com", "phone": "+1 555-123-4567", "is_student": True},
            {"name": "Zoë \"Z\" Ünal", "age": 150, "is_student": False},
            {"name": "x", "age": 42, "phone": "0123456789"},
        ],
        [
            {"name": "", "age": 3},
            {"name": "Al", "age": -1},
            {"name": "Al", "age": 151},
            {"name": "Al", "age": 3.5},
            {"name": "Al"},
            {"name": "Al", "age": 30, "email": "not-an-email"},
            {"name": "Al", "age": 30, "extra": 1},
            {"name": "Al", "age": 30, "phone": "12ab"},
            ["Al", 30],
        ],
    ),
    "address_refs": (
        [
            {"customer": "ACME", "billing": {"street": "1 Main St", "city": "Springfield", "postal_code": "12345", "country": "US"}},
            {"customer": "Zed", "billing": {"street": "9 Rue", "city": "Québec", "postal_code": "12345-6789", "country": "CA"},
             "shipping": {"street": "2 Side", "city": "Tijuana", "postal_code": "22000", "country": "MX"}},
            {"customer": "", "billing": {"street": "x", "city": "y", "postal_code": "00000", "country": "US"}},
        ],
        [
            {"customer": "ACME"},
            {"customer": "ACME", "billing": {"street": "1 Main", "city": "S", "postal_code": "1234", "country": "US"}},
            {"customer": "ACME", "billing": {"street": "1 Main", "city": "S", "postal_code": "12345", "country": "FR"}},
            {"customer": "ACME", "billing": {"street": "", "city": "S", "postal_code": "12345", "country": "US"}},
            {"customer": "ACME", "billing": {"street": "1", "city": "S", "postal_code": "12345", "country": "US", "zip": 1}},
        ],
    ),
    "invoice": (
        [
            {"invoice_number": "INV-0001", "issued": "2024-02-29", "currency": "USD",
             "lines": [{"description": "Widget", "quantity": 2, "unit_price": 9.99}], "total": 19.98},
            {"invoice_number": "INV-12345678", "issued": "2023-12-31", "due": "2024-01-30", "currency": "EUR",
             "lines": [{"description": "A", "quantity": 1, "unit_price": 0}, {"description": "B", "quantity": 10, "unit_price": 1.5}],
             "total": 15, "paid": False},
            {"invoice_number": "INV-9999", "issued": "2000-02-29", "currency": "GBP",
             "lines": [{"description": "Consulting", "quantity": 3, "unit_price": 120}], "total": 360, "paid": True},
        ],
        [
            {"invoice_number": "INV-01", "issued": "2024-01-01", "currency": "USD", "lines": [{"description": "W", "quantity": 1, "unit_price": 1}], "total": 1},
            {"invoice_number": "INV-0001", "issued": "2023-02-29", "currency": "USD", "lines": [{"description": "W", "quantity": 1, "unit_price": 1}], "total": 1},
            {"invoice_number": "INV-0001", "issued": "2024-01-01", "currency": "JPY", "lines": [{"description": "W", "quantity": 1, "unit_price": 1}], "total": 1},
            {"invoice_number": "INV-0001", "issued": "2024-01-01", "currency": "USD", "lines": [], "total": 0},
            {"invoice_number": "INV-0001", "issued": "2024-01-01", "currency": "USD", "lines": [{"description": "W", "quantity": 0, "unit_price": 1}], "total": 1},
            {"invoice_number": "INV-0001", "issued": "2024-01-01", "currency": "USD", "lines": [{"description": "W", "quantity": 1, "unit_price": -1}], "total": 1},
            {"invoice_number": "INV-0001", "issued": "1900-02-29", "currency": "USD", "lines": [{"description": "W", "quantity": 1, "unit_price": 1}], "total": 1},
        ],
    ),
    "order_line_items": (
        [
            {"order_id": UUID, "customer": {"id": 1}, "items": [{"sku": "ABC-123", "qty": 1}], "status": "pending"},
            {"order_id": UUID.upper(), "customer": {"id": 77, "email": "a.b@shop.co"},
             "items": [{"sku": "XYZ-999", "qty": 100, "gift": True}, {"sku": "AAA-000", "qty": 5}],
             "status": "shipped", "created_at": "2024-05-01T12:30:00Z"},
            {"order_id": UUID, "customer": {"id": 2}, "items": [{"sku": "QQQ-555", "qty": 50, "gift": False}],
             "status": "cancelled", "created_at": "2024-05-01T12:30:00.123+02:00"},
        ],
        [
            {"order_id": "not-a-uuid", "customer": {"id": 1}, "items": [{"sku": "ABC-123", "qty": 1}], "status": "pending"},
            {"order_id": UUID, "customer": {"id": 0}, "items": [{"sku": "ABC-123", "qty": 1}], "status": "pending"},
            {"order_id": UUID, "customer": {"id": 1}, "items": [], "status": "pending"},
            {"order_id": UUID, "customer": {"id": 1}, "items": [{"sku": "abc-123", "qty": 1}], "status": "pending"},
            {"order_id": UUID, "customer": {"id": 1}, "items": [{"sku": "ABC-123", "qty": 101}], "status": "pending"},
            {"order_id": UUID, "customer": {"id": 1}, "items": [{"sku": "ABC-123", "qty": 1}], "status": "lost"},
        ],
    ),
    "calendar_event": (
        [
            {"title": "Standup", "start": "2024-03-01T09:00:00Z", "end": "2024-03-01T09:15:00Z"},
            {"title": "Offsite", "start": "2024-06-10T00:00:00+01:00", "end": "2024-06-12T00:00:00+01:00", "all_day": True,
             "location": None, "attendees": ["a@x.io", "b@y.org"], "reminder_minutes": 60},
            {"title": "1:1", "start": "2024-03-01T10:00:00-05:00", "end": "2024-03-01T10:30:00-05:00", "location": "Room 4",
             "attendees": [], "reminder_minutes": 0},
        ],
        [
            {"title": "", "start": "2024-03-01T09:00:00Z", "end": "2024-03-01T09:15:00Z"},
            {"title": "x" * 81, "start": "2024-03-01T09:00:00Z", "end": "2024-03-01T09:15:00Z"},
            {"title": "T", "start": "2024-03-01 09:00", "end": "2024-03-01T09:15:00Z"},
            {"title": "T", "start": "2024-03-01T09:00:00Z", "end": "2024-03-01T09:15:00Z", "reminder_minutes": 7},
            {"title": "T", "start": "2024-03-01T09:00:00Z", "end": "2024-03-01T09:15:00Z", "attendees": ["nobody"]},
            {"title": "T", "start": "2024-03-01T09:00:00Z", "end": "2024-03-01T09:15:00Z", "location": 3},
        ],
    ),
    "product_catalog": (
        [
            {"store": "Shop", "products": []},
            {"store": "Shop", "products": [{"id": 1, "name": "Pen", "price": {"amount": 0.5, "currency": "USD"}}]},
            {"store": "Ünïcode", "products": [
                {"id": 2, "name": "Book", "price": {"amount": 12, "currency": "USD"}, "tags": ["paper", "read"], "in_stock": True},
                {"id": 3, "name": "Lamp", "price": {"amount": 99.99, "currency": "USD"}, "tags": [], "in_stock": False}]},
        ],
        [
            {"store": "Shop", "products": [{"id": 0, "name": "Pen", "price": {"amount": 1, "currency": "USD"}}]},
            {"store": "Shop", "products": [{"id": 1, "name": "Pen", "price": {"amount": 0, "currency": "USD"}}]},
            {"store": "Shop", "products": [{"id": 1, "name": "Pen", "price": {"amount": 1, "currency": "EUR"}}]},
            {"store": "Shop", "products": [{"id": 1, "name": "Pen", "price": {"amount": 1, "currency": "USD"}, "tags": ["a", "b", "c", "d", "e", "f"]}]},
            {"store": "Shop", "products": [{"id": 1, "name": "", "price": {"amount": 1, "currency": "USD"}}]},
            {"products": []},
        ],
    ),
    "github_issue": (
        [
            {"number": 1, "title": "Crash on start", "state": "open", "user": {"login": "octocat", "id": 1}},
            {"number": 42, "title": "Docs", "state": "closed", "user": {"login": "a-b", "id": 9},
             "labels": [{"name": "bug", "color": "d73a4a"}, {"name": "good first issue", "color": "7057FF"}],
             "assignee": None, "body": None, "comments": 0},
            {"number": 7, "title": "Feature", "state": "open", "user": {"login": "x", "id": 3},
             "assignee": {"login": "y", "id": 4}, "body": "Please add\n- a\n- b", "comments": 12},
        ],
        [
            {"number": 0, "title": "T", "state": "open", "user": {"login": "o", "id": 1}},
            {"number": 1, "title": "", "state": "open", "user": {"login": "o", "id": 1}},
            {"number": 1, "title": "T", "state": "merged", "user": {"login": "o", "id": 1}},
            {"number": 1, "title": "T", "state": "open", "user": {"login": "bad login", "id": 1}},
            {"number": 1, "title": "T", "state": "open", "user": {"login": "o", "id": 1}, "labels": [{"name": "x", "color": "red"}]},
            {"number": 1, "title": "T", "state": "open", "user": {"login": "o", "id": 1}, "assignee": "someone"},
        ],
    ),
    "k8s_container": (
        [
            {"name": "web", "image": "nginx:1.25"},
            {"name": "api-server", "image": "ghcr.io/acme/api@sha256:abc", "imagePullPolicy": "Always",
             "command": ["/bin/api", "--port=8080"], "ports": [{"name": "http", "containerPort": 8080, "protocol": "TCP"}],
             "env": [{"name": "MODE", "value": "prod"}, {"name": "EMPTY"}],
             "resources": {"limits": {"cpu": "500m", "memory": "256Mi"}, "requests": {"cpu": "1", "memory": "128Mi"}}},
            {"name": "a" * 63, "image": "busybox", "ports": [{"containerPort": 65535}, {"containerPort": 1, "protocol": "SCTP"}]},
        ],
        [
            {"name": "Web", "image": "nginx"},
            {"name": "-web", "image": "nginx"},
            {"name": "a" * 64, "image": "nginx"},
            {"name": "web", "image": ""},
            {"name": "web", "image": "nginx", "ports": [{"containerPort": 0}]},
            {"name": "web", "image": "nginx", "ports": [{"containerPort": 80, "protocol": "HTTP"}]},
            {"name": "web", "image": "nginx", "resources": {"limits": {"memory": "1Tb"}}},
            {"name": "web", "image": "nginx", "replicas": 2},
        ],
    ),
    "openai_function_args": (
        [
            {"location": "Paris, France", "unit": "celsius"},
            {"location": "Boston, MA", "unit": "fahrenheit", "days": 14},
            {"location": "", "unit": "celsius", "days": 1},
        ],
        [
            {"location": "Paris"},
            {"location": "Paris", "unit": "kelvin"},
            {"location": "Paris", "unit": "celsius", "days": 0},
            {"location": "Paris", "unit": "celsius", "days": 15},
            {"location": "Paris", "unit": "celsius", "country": "FR"},
            {"unit": "celsius"},
        ],
    ),
    "tool_call_oneof": (
        [
            {"name": "get_weather", "arguments": {"city": "Oslo"}},
            {"name": "search", "arguments": {"query": "json schema", "limit": 5}},
            {"name": "send_email", "arguments": {"to": "x@y.z", "subject": "Hi", "body": ""}},
        ],
        [
            {"name": "get_weather", "arguments": {"query": "Oslo"}},
            {"name": "search", "arguments": {"query": ""}},
            {"name": "search", "arguments": {"query": "q", "limit": 51}},
            {"name": "send_email", "arguments": {"to": "nope", "subject": "Hi", "body": ""}},
            {"name": "delete_all", "arguments": {}},
            {"name": "get_weather"},
        ],
    ),
    "nested_arrays": (
        [
            {"matrix": [], "teams": []},
            {"matrix": [[1, 2.5], [-3e2], [0, 0, 0, 0]], "teams": [{"name": "Core", "members": [{"name": "A", "role": "lead"}]}]},
            {"matrix": [[1]], "teams": [{"name": "X", "members": [{"name": "B", "role": "dev"}, {"name": "C", "role": "qa"}]},
                                        {"name": "Y", "members": [{"name": "D", "role": "dev"}]}]},
        ],
        [
            {"matrix": [[]], "teams": []},
            {"matrix": [[1, 2, 3, 4, 5]], "teams": []},
            {"matrix": [[1], [2], [3], [4], [5]], "teams": []},
            {"matrix": [["1"]], "teams": []},
            {"matrix": [], "teams": [{"name": "X", "members": []}]},
            {"matrix": [], "teams": [{"name": "X", "members": [{"name": "B", "role": "boss"}]}]},
        ],
    ),
    "enums": (
        [
            {"color": "red", "size": 1, "mixed": "auto", "shape": "none", "quoted": "say \"hi\""},
            {"color": "blue", "size": 8, "mixed": None, "shape": {"kind": "circle", "r": 1}, "quoted": "café"},
            {"color": "green", "size": 5, "mixed": 2.5, "shape": [1, 2], "quoted": "back\\slash"},
            {"color": "green", "size": 3, "mixed": True, "shape": [1, 2], "quoted": "tab\there"},
            {"color": "green", "size": 2, "mixed": 0, "shape": "none", "quoted": "日本"},
        ],
        [
            {"color": "yellow", "size": 1, "mixed": "auto", "shape": "none", "quoted": "café"},
            {"color": "red", "size": 4, "mixed": "auto", "shape": "none", "quoted": "café"},
            {"color": "red", "size": 1, "mixed": False, "shape": "none", "quoted": "café"},
            {"color": "red", "size": 1, "mixed": 1, "shape": "none", "quoted": "café"},
            {"color": "red", "size": 1, "mixed": "auto", "shape": [2, 1], "quoted": "café"},
            {"color": "red", "size": 1, "mixed": "auto", "shape": {"kind": "circle", "r": 2}, "quoted": "café"},
            {"color": "red", "size": 1, "mixed": "auto", "shape": "none", "quoted": "cafe"},
        ],
    ),
    "nullable_fields": (
        [
            {"nickname": None, "score": None, "manager": None},
            {"nickname": "Bobby", "score": 10, "manager": {"id": 7}, "tags": ["a"]},
            {"nickname": "", "score": 0, "manager": {"id": -1}, "tags": None},
        ],
        [
            {"nickname": "x" * 21, "score": None, "manager": None},
            {"nickname": None, "score": -1, "manager": None},
            {"nickname": None, "score": "1", "manager": None},
            {"nickname": None, "score": None, "manager": {}},
            {"nickname": None, "score": None},
            {"nickname": None, "score": None, "manager": None, "tags": [1]},
        ],
    ),
    "numeric_ranges": (
        [
            {"adult_age": 18, "temperature_c": -40, "percentage": 0, "probability": 0},
            {"adult_age": 130, "temperature_c": 125, "percentage": 100, "probability": 0.999, "debt": -12.5,
             "big_id": 9007199254740991, "rating": 5, "offset": -9},
            {"adult_age": 42, "temperature_c": 0, "percentage": 33.333, "probability": 0.5, "debt": 0,
             "big_id": 1000000000000, "rating": 0.5, "offset": 9},
        ],
        [
            {"adult_age": 17, "temperature_c": 0, "percentage": 0, "probability": 0},
            {"adult_age": 131, "temperature_c": 0, "percentage": 0, "probability": 0},
            {"adult_age": 20, "temperature_c": -41, "percentage": 0, "probability": 0},
            {"adult_age": 20, "temperature_c": 0, "percentage": 100.01, "probability": 0},
            {"adult_age": 20, "temperature_c": 0, "percentage": 1, "probability": 1},
            {"adult_age": 20, "temperature_c": 0, "percentage": 1, "probability": 0, "debt": 0.1},
            {"adult_age": 20, "temperature_c": 0, "percentage": 1, "probability": 0, "rating": 0.49},
            {"adult_age": 20, "temperature_c": 0, "percentage": 1, "probability": 0, "offset": 10},
            {"adult_age": 20, "temperature_c": 0, "percentage": 1, "probability": 0, "big_id": 999999999999},
        ],
    ),
    "formats": (
        [
            {"date": "2024-02-29", "time": "23:59:59Z", "date_time": "2024-01-01T00:00:00Z", "email": "a@b.co",
             "uuid": UUID, "uri": "https://example.com/a/b?c=d#e", "ipv4": "192.168.0.1", "ipv6": "::1",
             "hostname": "example.com"},
            {"date": "1999-12-31", "time": "08:30:06.283185+05:30", "date_time": "1985-04-12T23:20:50.52z",
             "email": "first.last+tag@sub.example.org", "uuid": UUID.upper(), "uri": "urn:isbn:0451450523",
             "ipv4": "0.0.0.0", "ipv6": "2001:db8:85a3::8a2e:370:7334", "hostname": "a-b.c-d.example"},
            {"date": "2000-02-29", "time": "23:59:60Z", "date_time": "1990-12-31T15:59:59-08:00",
             "email": "x@localhost", "uuid": "00000000-0000-0000-0000-000000000000", "uri": "mailto:x@y.z",
             "ipv4": "255.255.255.255", "ipv6": "::ffff:192.0.2.128", "hostname": "localhost"},
        ],
        [
            {"date": "2023-02-29", "time": "23:59:59Z", "date_time": "2024-01-01T00:00:00Z", "email": "a@b.co",
             "uuid": UUID, "uri": "https://example.com", "ipv4": "1.1.1.1", "ipv6": "::1", "hostname": "example.com"},
            {"date": "2024-02-28", "time": "23:59:59Z", "date_time": "2024-01-01T00:00:00Z", "email": "ab.co",
             "uuid": UUID, "uri": "https://example.com", "ipv4": "1.1.1.1", "ipv6": "::1", "hostname": "example.com"},
            {"date": "2024-02-28", "time": "23:59:59Z", "date_time": "2024-01-01T00:00:00Z", "email": "a@b.co",
             "uuid": UUID[:-1], "uri": "https://example.com", "ipv4": "1.1.1.1", "ipv6": "::1", "hostname": "example.com"},
            {"date": "2024-02-28", "time": "23:59:59Z", "date_time": "2024-01-01T00:00:00Z", "email": "a@b.co",
             "uuid": UUID, "uri": "https://example.com", "ipv4": "256.1.1.1", "ipv6": "::1", "hostname": "example.com"},
            {"date": "2024-02-28", "time": "23:59:59Z", "date_time": "2024-01-01T00:00:00Z", "email": "a@b.co",
             "uuid": UUID, "uri": "https://example.com", "ipv4": "01.1.1.1", "ipv6": "::1", "hostname": "example.com"},
            {"date": "2024-02-28", "time": "23:59:59Z", "date_time": "2024-01-01T00:00:00Z", "email": "a@b.co",
             "uuid": UUID, "uri": "https://example.com", "ipv4": "1.1.1.1", "ipv6": "1:2:3:4:5:6:7:8:9", "hostname": "example.com"},
        ],
    ),
    "optional_properties": (
        [
            {"a": 1},
            {"c": False},
            {"a": -5, "b": "hello", "c": True, "d": None, "e": [1, 2, 3]},
            {"b": "", "e": []},
        ],
        [
            {},
            {"a": 1.5},
            {"b": "x" * 11},
            {"e": [1, 2, 3, 4]},
            {"f": 1},
            {"a": 1, "z": None},
        ],
    ),
    "map_additional_properties": (
        [
            {},
            {"the": 12, "quick": 1, "fox": 0},
            {"abcdefghijkl": 3},
        ],
        [
            {"The": 1},
            {"abcdefghijklm": 1},
            {"fox": -1},
            {"fox": 1.5},
            {"": 1},
            {"a b": 1},
        ],
    ),
    "declared_plus_additional": (
        [
            {"id": 1},
            {"id": 2, "name": "long name is fine", "nick": "bob", "x": ""},
            {"id": 3, "zz": "12345678"},
        ],
        [
            {"name": "a"},
            {"id": 1, "nick": "123456789"},
            {"id": 1, "nick": 5},
            {"id": "1"},
            {"id": 1, "name": 2},
        ],
    ),
    "tuple_prefix_items": (
        [
            [48.85, 2.35],
            [-90, 180, "South Pole-ish"],
            [0, 0, ""],
        ],
        [
            [48.85],
            [91, 0],
            [0, -181],
            [0, 0, 5],
            [0, 0, "a", "b"],
            {"lat": 0, "lon": 0},
        ],
    ),
    "oneof_discriminator": (
        [
            {"shape": {"kind": "circle", "radius": 1.5}},
            {"shape": {"kind": "rect", "w": 0, "h": 2}},
            {"shape": {"kind": "point"}},
        ],
        [
            {"shape": {"kind": "circle", "radius": 0}},
            {"shape": {"kind": "rect", "w": 1}},
            {"shape": {"kind": "triangle"}},
            {"shape": {"kind": "point", "x": 1}},
            {"shape": None},
            {},
        ],
    ),
    "allof_composition": (
        [
            {"id": UUID, "title": "Hello world", "word_count": 2},
            {"id": UUID, "created": "2024-01-01T00:00:00Z", "title": "Abc", "word_count": 0},
            {"id": UUID, "title": "x" * 60, "word_count": 1000},
        ],
        [
            {"id": UUID, "title": "Hi", "word_count": 1},
            {"id": UUID, "title": "x" * 61, "word_count": 1},
            {"id": "nope", "title": "Hello", "word_count": 1},
            {"title": "Hello", "word_count": 1},
            {"id": UUID, "title": "Hello"},
            {"id": UUID, "title": "Hello", "word_count": -1},
        ],
    ),
    "defs_chain": (
        [
            {"id": 1, "slash": "slash", "tilde": "tilde", "percent": True},
            {"id": 99, "slash": "slash", "tilde": "tilde", "percent": False, "legacy": "abc"},
            {"id": 12345678901234567890, "slash": "slash", "tilde": "tilde", "percent": True, "legacy": ""},
        ],
        [
            {"id": 0, "slash": "slash", "tilde": "tilde", "percent": True},
            {"id": 1, "slash": "tilde", "tilde": "tilde", "percent": True},
            {"id": 1, "slash": "slash", "tilde": "slash", "percent": True},
            {"id": 1, "slash": "slash", "tilde": "tilde", "percent": "yes"},
            {"id": 1, "slash": "slash", "tilde": "tilde", "percent": True, "legacy": "abcdef"},
        ],
    ),
    "const_values": (
        [
            {"api_version": "v1", "kind": "Deployment", "replicas": 3, "meta": {"managed": True, "owner": None}},
            {"api_version": "v1", "kind": "Deployment", "replicas": 3.0, "meta": {"managed": True, "owner": None}, "ratio": 0.25},
            {"api_version": "v1", "kind": "Deployment", "replicas": 3, "meta": {"managed": True, "owner": None}, "ratio": 0.250},
        ],
        [
            {"api_version": "v2", "kind": "Deployment", "replicas": 3, "meta": {"managed": True, "owner": None}},
            {"api_version": "v1", "kind": "Pod", "replicas": 3, "meta": {"managed": True, "owner": None}},
            {"api_version": "v1", "kind": "Deployment", "replicas": 4, "meta": {"managed": True, "owner": None}},
            {"api_version": "v1", "kind": "Deployment", "replicas": 3, "meta": {"managed": False, "owner": None}},
            {"api_version": "v1", "kind": "Deployment", "replicas": 3, "meta": {"managed": True, "owner": None}, "ratio": 0.5},
        ],
    ),
    "unique_enum_items": (
        [
            {"permissions": ["read"]},
            {"permissions": ["admin", "read", "write", "audit"], "flags": [True, False]},
            {"permissions": ["write", "read"], "flags": []},
        ],
        [
            {"permissions": []},
            {"permissions": ["read", "read"]},
            {"permissions": ["read", "delete"]},
            {"permissions": ["read"], "flags": [True, True]},
            {"permissions": ["read", "write", "admin", "audit", "read"]},
        ],
    ),
    "log_entry": (
        [
            {"timestamp": "2024-05-05T10:00:00Z", "level": "INFO", "message": "started"},
            {"timestamp": "2024-05-05T10:00:00.5+00:00", "level": "ERROR", "message": "boom", "logger": "app.db.pool",
             "context": {"retries": 3, "host": "db1", "ok": False, "extra": None}},
            {"timestamp": "2024-05-05T10:00:00Z", "level": "DEBUG", "message": "x", "logger": "_private", "context": {}},
        ],
        [
            {"timestamp": "yesterday", "level": "INFO", "message": "x"},
            {"timestamp": "2024-05-05T10:00:00Z", "level": "TRACE", "message": "x"},
            {"timestamp": "2024-05-05T10:00:00Z", "level": "INFO", "message": ""},
            {"timestamp": "2024-05-05T10:00:00Z", "level": "INFO", "message": "x", "logger": "App.DB"},
            {"timestamp": "2024-05-05T10:00:00Z", "level": "INFO", "message": "x", "context": {"a": [1]}},
            {"timestamp": "2024-05-05T10:00:00Z", "level": "INFO", "message": "x", "logger": "a..b"},
        ],
    ),
    "weather_report": (
        [
            {"city": "Oslo", "temperature": -3.5, "conditions": "snow"},
            {"city": "Cairo", "temperature": 41, "conditions": "sunny", "humidity": 10,
             "forecast": [{"day": "2024-07-01", "high": 42, "low": 28.5}]},
            {"city": "Lima", "temperature": 18.25, "conditions": "fog", "humidity": 100, "forecast": []},
        ],
        [
            {"city": "X", "temperature": 61, "conditions": "sunny"},
            {"city": "X", "temperature": -91, "conditions": "sunny"},
            {"city": "X", "temperature": 1, "conditions": "hail"},
            {"city": "X", "temperature": 1, "conditions": "rain", "humidity": 101},
            {"city": "X", "temperature": 1, "conditions": "rain", "forecast": [{"day": "2024-07-01", "high": 1}]},
            {"city": "X", "temperature": 1, "conditions": "rain", "forecast": [{"day": "2024-07-01", "high": 1, "low": 0}] * 8},
        ],
    ),
    "recipe": (
        [
            {"title": "Tea", "servings": 1, "ingredients": [{"name": "tea", "amount": 1, "unit": "tsp"}], "steps": ["Boil water", "Steep"]},
            {"title": "Bread", "servings": 8, "ingredients": [{"name": "flour", "amount": 0.5, "unit": "kg"},
                                                             {"name": "water", "amount": 350, "unit": "ml"}],
             "steps": ["Mix", "Knead", "Bake"], "vegetarian": True},
            {"title": "Egg", "servings": 20, "ingredients": [{"name": "egg", "amount": 1e-3, "unit": "piece"}], "steps": ["Cook"], "vegetarian": False},
        ],
        [
            {"title": "", "servings": 1, "ingredients": [{"name": "t", "amount": 1, "unit": "g"}], "steps": ["x"]},
            {"title": "T", "servings": 0, "ingredients": [{"name": "t", "amount": 1, "unit": "g"}], "steps": ["x"]},
            {"title": "T", "servings": 1, "ingredients": [], "steps": ["x"]},
            {"title": "T", "servings": 1, "ingredients": [{"name": "t", "amount": 0, "unit": "g"}], "steps": ["x"]},
            {"title": "T", "servings": 1, "ingredients": [{"name": "t", "amount": 1, "unit": "oz"}], "steps": ["x"]},
            {"title": "T", "servings": 1, "ingredients": [{"name": "t", "amount": 1, "unit": "g"}], "steps": [""]},
        ],
    ),
    "user_profile": (
        [
            {"username": "ada_99", "display_name": "Ada"},
            {"username": "bob", "display_name": "Bob B.", "bio": "Hi é, I like JSON.", "website": "https://bob.dev/",
             "birthday": "1990-01-31", "followers": 0},
            {"username": "a" * 16, "display_name": "x" * 50, "bio": "", "followers": 123456},
        ],
        [
            {"username": "ab", "display_name": "Ab"},
            {"username": "Bob", "display_name": "Bob"},
            {"username": "bob", "display_name": ""},
            {"username": "bob", "display_name": "Bob", "bio": "x" * 161},
            {"username": "bob", "display_name": "Bob", "website": "not a uri"},
            {"username": "bob", "display_name": "Bob", "birthday": "1990-13-01"},
            {"username": "bob", "display_name": "Bob", "age": 3},
        ],
    ),
    "movie": (
        [
            {"title": "Metropolis", "year": 1927},
            {"title": "Alien", "year": 1979, "genres": ["horror", "sci-fi"], "rating": 8.5, "director": {"name": "Ridley Scott", "born": 1937}},
            {"title": "Future", "year": 2100, "genres": [], "rating": 0, "director": {"name": "TBD"}},
        ],
        [
            {"title": "Old", "year": 1887},
            {"title": "Alien", "year": 1979, "genres": ["horror", "horror"]},
            {"title": "Alien", "year": 1979, "genres": ["horror", "sci-fi", "drama", "action"]},
            {"title": "Alien", "year": 1979, "genres": ["western"]},
            {"title": "Alien", "year": 1979, "rating": 10.5},
            {"title": "Alien", "year": 1979, "director": {}},
        ],
    ),
    "bank_transaction": (
        [
            {"iban": "DE89370400440532013000", "amount": 10.5, "currency": "EUR", "direction": "debit"},
            {"iban": "GB29NWBK60161331926819", "amount": 1000000, "currency": "GBP", "direction": "credit",
             "booked_at": "2024-01-31T23:59:59Z", "reference": "Invoice 42"},
            {"iban": "FR1420041010050500013M02606", "amount": 0.01, "currency": "EUR", "direction": "debit", "reference": ""},
        ],
        [
            {"iban": "de89370400440532013000", "amount": 10, "currency": "EUR", "direction": "debit"},
            {"iban": "DE89370400440532013000", "amount": 0, "currency": "EUR", "direction": "debit"},
            {"iban": "DE89370400440532013000", "amount": 1000000.01, "currency": "EUR", "direction": "debit"},
            {"iban": "DE89370400440532013000", "amount": 10, "currency": "EURO", "direction": "debit"},
            {"iban": "DE89370400440532013000", "amount": 10, "currency": "EUR", "direction": "sideways"},
            {"iban": "DE89370400440532013000", "amount": 10, "currency": "EUR", "direction": "debit", "reference": "x" * 36},
        ],
    ),
    "sensor_readings": (
        [
            {"device_id": UUID, "readings": []},
            {"device_id": UUID, "battery": 87, "gateway_ip": "10.0.0.254",
             "readings": [{"t": "2024-01-01T00:00:00Z", "value": 21.5}, {"t": "2024-01-01T00:01:00Z", "value": -0.25}]},
            {"device_id": UUID, "battery": 0, "readings": [{"t": "2024-01-01T00:00:00+01:00", "value": 1e10}]},
        ],
        [
            {"device_id": "x", "readings": []},
            {"device_id": UUID, "battery": 101, "readings": []},
            {"device_id": UUID, "gateway_ip": "10.0.0", "readings": []},
            {"device_id": UUID, "readings": [{"t": "2024-01-01", "value": 1}]},
            {"device_id": UUID, "readings": [{"t": "2024-01-01T00:00:00Z"}]},
            {"device_id": UUID},
        ],
    ),
    "server_config": (
        [
            {"host": "localhost", "port": 8080},
            {"host": "api.internal.example.com", "port": 443, "tls": True, "bind_v6": "::", "allowed_ips": ["10.0.0.1", "192.168.1.20"],
             "workers": 64, "log_level": "info"},
            {"host": "a1", "port": 1, "bind_v6": "fe80::1:2:3:4", "allowed_ips": [], "workers": 1},
        ],
        [
            {"host": "-bad-", "port": 80},
            {"host": "ok", "port": 0},
            {"host": "ok", "port": 65536},
            {"host": "ok", "port": 80, "bind_v6": "1.2.3.4"},
            {"host": "ok", "port": 80, "allowed_ips": ["300.1.1.1"]},
            {"host": "ok", "port": 80, "workers": 65},
            {"host": "ok", "port": 80, "debug": True},
        ],
    ),
    "package_json_subset": (
        [
            {"name": "left-pad", "version": "1.3.0"},
            {"name": "@acme/ui-kit", "version": "0.0.1-beta.2", "private": True, "license": "MIT",
             "dependencies": {"react": "^18.2.0", "lodash": "~4.17.21"}},
            {"name": "a", "version": "10.20.30", "dependencies": {}},
        ],
        [
            {"name": "Left-Pad", "version": "1.3.0"},
            {"name": "left-pad", "version": "1.3"},
            {"name": "left-pad", "version": "01.3.0"},
            {"name": "left pad", "version": "1.3.0"},
            {"name": "left-pad", "version": "1.3.0", "dependencies": {"react": 18}},
            {"version": "1.0.0"},
        ],
    ),
    "json_patch_op": (
        [
            {"op": "add", "path": "/a/b", "value": [1, {"x": None}]},
            {"op": "remove", "path": "/items/0"},
            {"op": "move", "from": "/a", "path": "/b"},
            {"op": "test", "path": "", "value": "x"},
        ],
        [
            {"op": "add", "path": "a/b", "value": 1},
            {"op": "add", "path": "/a"},
            {"op": "remove", "path": "/a", "value": 1},
            {"op": "copy", "path": "/b"},
            {"op": "frobnicate", "path": "/a"},
            {"path": "/a"},
        ],
    ),
    "geojson_point": (
        [
            {"type": "Point", "coordinates": [2.35, 48.85]},
            {"type": "Point", "coordinates": [-180, -90], "bbox": [-180, -90, 180, 90]},
            {"type": "Point", "coordinates": [0, 0], "bbox": [0, 0, 0, 0]},
        ],
        [
            {"type": "Polygon", "coordinates": [0, 0]},
            {"type": "Point", "coordinates": [0]},
            {"type": "Point", "coordinates": [0, 0, 0]},
            {"type": "Point", "coordinates": [181, 0]},
            {"type": "Point", "coordinates": [0, 91]},
            {"type": "Point", "coordinates": [0, 0], "bbox": [1, 2, 3]},
        ],
    ),
    "pagination": (
        [
            {"page": 1, "per_page": 10, "total": 0, "items": []},
            {"page": 3, "per_page": 2, "total": 6, "items": [{"id": 5, "name": "E"}, {"id": 6, "name": "F"}]},
            {"page": 1, "per_page": 100, "total": 1, "items": [{"id": 1, "name": ""}]},
        ],
        [
            {"page": 0, "per_page": 10, "total": 0, "items": []},
            {"page": 1, "per_page": 101, "total": 0, "items": []},
            {"page": 1, "per_page": 10, "total": -1, "items": []},
            {"page": 1, "per_page": 10, "total": 0, "items": [{"id": 1}]},
            {"page": 1, "per_page": 10, "total": 0, "items": [{"id": 1, "name": "a", "email": "x"}]},
            {"page": 1, "per_page": 10, "total": 0, "items": [{"id": i, "name": "n"} for i in range(1, 12)]},
        ],
    ),
    "error_response": (
        [
            {"error": {"code": 404, "message": "Not found"}},
            {"error": {"code": 422, "message": "Invalid", "details": [{"field": "email", "issue": "format"}]}},
            {"error": {"code": 599, "message": "x", "details": None}},
        ],
        [
            {"error": {"code": 200, "message": "OK"}},
            {"error": {"code": 600, "message": "?"}},
            {"error": {"code": 500, "message": ""}},
            {"error": {"code": 500, "message": "x", "details": [{"field": "a"}]}},
            {"error": {"code": 500}},
            {"error": {"code": 500, "message": "x"}, "status": 500},
        ],
    ),
    "survey_answer": (
        [
            {"question_id": 1, "answer": "Yes"},
            {"question_id": 2, "answer": 4.5},
            {"question_id": 3, "answer": False},
            {"question_id": 4, "answer": ["a", "b"]},
        ],
        [
            {"question_id": 0, "answer": "Yes"},
            {"question_id": 1, "answer": None},
            {"question_id": 1, "answer": []},
            {"question_id": 1, "answer": ["a", "b", "c", "d", "e", "f"]},
            {"question_id": 1, "answer": {"x": 1}},
            {"question_id": 1, "answer": "x" * 201},
        ],
    ),
    "chat_message": (
        [
            {"role": "user", "content": "Hello! 👋"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "call_abc12345", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}}]},
            {"role": "system", "content": "You are helpful.\nBe brief."},
        ],
        [
            {"role": "bot", "content": "hi"},
            {"role": "user"},
            {"role": "user", "content": 5},
            {"role": "assistant", "content": None, "tool_calls": [{"id": "abc", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
            {"role": "assistant", "content": None, "tool_calls": [{"id": "call_abc12345", "type": "tool", "function": {"name": "f", "arguments": "{}"}}]},
            {"role": "assistant", "content": None, "tool_calls": [{"id": "call_abc12345", "type": "function", "function": {"name": "bad name", "arguments": "{}"}}]},
        ],
    ),
    "draft4_style": (
        [
            {"score": 0, "attempts": 1},
            {"score": 9.99, "attempts": 5},
            {"score": 5, "attempts": 3},
        ],
        [
            {"score": 10, "attempts": 1},
            {"score": -0.1, "attempts": 1},
            {"score": 1, "attempts": 0},
            {"score": 1, "attempts": 6},
            {"score": 1},
        ],
    ),
    "classification": (
        [
            {"label": "positive", "confidence": 0.93, "reasons": ["great service"]},
            {"label": "neutral", "confidence": 0.5, "reasons": ["mixed", "ok-ish", "meh"]},
            {"label": "negative", "confidence": 1, "reasons": ["bad"]},
        ],
        [
            {"label": "mixed", "confidence": 0.5, "reasons": ["abc"]},
            {"label": "positive", "confidence": 1.01, "reasons": ["abc"]},
            {"label": "positive", "confidence": 0.5, "reasons": []},
            {"label": "positive", "confidence": 0.5, "reasons": ["ab"]},
            {"label": "positive", "confidence": 0.5, "reasons": ["abc", "abc", "abc", "abc"]},
            {"label": "positive", "confidence": 0.5, "reasons": ["abc"], "notes": ""},
        ],
    ),
    "entity_extraction": (
        [
            {"entities": []},
            {"entities": [{"text": "Ada", "type": "PERSON", "start": 0, "end": 3}]},
            {"entities": [{"text": "Paris", "type": "LOC", "start": 10, "end": 15}, {"text": "1999", "type": "DATE", "start": 20, "end": 24}]},
        ],
        [
            {"entities": [{"text": "", "type": "PERSON", "start": 0, "end": 0}]},
            {"entities": [{"text": "x", "type": "THING", "start": 0, "end": 1}]},
            {"entities": [{"text": "x", "type": "ORG", "start": -1, "end": 1}]},
            {"entities": [{"text": "x", "type": "ORG", "start": 0}]},
            {"entities": [{"text": "x", "type": "ORG", "start": 0, "end": 1, "score": 0.9}]},
            {},
        ],
    ),
    "ref_with_siblings": (
        [
            {"short_name": "abc", "small_count": 0, "code": "X"},
            {"short_name": "abcdefgh", "small_count": 9, "code": "ABC"},
            {"short_name": "é", "small_count": 5, "code": "Q"},
        ],
        [
            {"short_name": "", "small_count": 0, "code": "X"},
            {"short_name": "abcdefghi", "small_count": 0, "code": "X"},
            {"short_name": "a", "small_count": 10, "code": "X"},
            {"short_name": "a", "small_count": -1, "code": "X"},
            {"short_name": "a", "small_count": 1, "code": "x"},
            {"short_name": "a", "small_count": 1, "code": ""},
        ],
    ),
    "anyof_required": (
        [
            {"name": "A", "email": "a@b.c"},
            {"name": "B", "phone": "5551234"},
            {"name": "C", "email": "c@d.e", "phone": "123456789012"},
        ],
        [
            {"name": "A"},
            {"email": "a@b.c"},
            {"name": "A", "phone": "123"},
            {"name": "A", "email": "nope"},
            {"name": "A", "email": "a@b.c", "fax": "1"},
        ],
    ),
    "required_without_properties": (
        [
            {"kind": "note", "text": "hello", "meta": ""},
            {"kind": "note", "text": "", "meta": "m", "extra": "ok"},
            {"kind": "note", "text": "x" * 40, "meta": "é"},
        ],
        [
            {"kind": "note", "text": "hello"},
            {"kind": "memo", "text": "a", "meta": "b"},
            {"kind": "note", "text": 5, "meta": "b"},
            {"kind": "note", "text": "x" * 41, "meta": "b"},
            {"kind": "note", "text": "a", "meta": "b", "extra": 1},
        ],
    ),
    "feature_flags": (
        [
            {"version": 1, "flags": {}},
            {"version": 2, "flags": {"dark_mode": True, "beta2": False}},
            {"version": 10, "flags": {"x": True}},
        ],
        [
            {"version": 0, "flags": {}},
            {"version": 1, "flags": {"Dark": True}},
            {"version": 1, "flags": {"dark_mode": "yes"}},
            {"version": 1, "flags": {"9lives": True}},
            {"version": 1},
        ],
    ),
    "draft7_tuple": (
        [
            ["GET", "/"],
            ["POST", "/items", 201],
            ["DELETE", "/items/1", 204, 599],
        ],
        [
            ["GET"],
            ["PATCH", "/"],
            ["GET", "items"],
            ["GET", "/", 99],
            ["GET", "/", 200, 200, 200],
            ["GET", "/", "200"],
        ],
    ),
}


# ---------------------------------------------------------------------------------------------
# A format checker stricter than jsonschema's defaults (which skip date-time, time, uri, hostname
# without optional packages), written independently of the compiler's regexes.

FORMATS = jsonschema.FormatChecker()
_DT = re.compile(r"(\d{4}-\d{2}-\d{2})[Tt](\d{2}:\d{2}:\d{2}(?:\.\d+)?(?:[Zz]|[+-]\d{2}:\d{2}))")
_TIME = re.compile(r"(\d{2}):(\d{2}):(\d{2})(?:\.\d+)?(?:([Zz])|([+-])(\d{2}):(\d{2}))")


@FORMATS.checks("time")
def _is_time(s):
    if not isinstance(s, str):
        return True
    m = _TIME.fullmatch(s)
    if not m or not s.isascii():
        return False
    hh, mm, ss = int(m[1]), int(m[2]), int(m[3])
    if m[5] and (int(m[6]) > 23 or int(m[7]) > 59):
        return False
    if ss == 60:  # leap second: 23:59:60 UTC
        off = 0 if m[4] else (1 if m[5] == "+" else -1) * (int(m[6]) * 60 + int(m[7]))
        return (hh * 60 + mm - off) % 1440 == 23 * 60 + 59
    return hh < 24 and mm < 60 and ss < 60


@FORMATS.checks("date-time")
def _is_date_time(s):
    if not isinstance(s, str):
        return True
    m = _DT.fullmatch(s)
    if not m or not s.isascii():
        return False
    try:
        datetime.date.fromisoformat(m[1])
    except ValueError:
        return False
    return _is_time(m[2])


@FORMATS.checks("hostname")
def _is_hostname(s):
    if not isinstance(s, str):
        return True
    labels = s.split(".")
    return 0 < len(s) <= 253 and all(
        re.fullmatch(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?", x) for x in labels) and s.isascii()


@FORMATS.checks("uri")
def _is_uri(s):
    if not isinstance(s, str):
        return True
    if not s.isascii() or not re.match(r"[A-Za-z][A-Za-z0-9+.-]*:", s):
        return False
    if re.search(r"[\x00-\x20\"<>\\^`{|}\x7f]", s):
        return False
    return all(re.fullmatch(r"[0-9A-Fa-f]{2}", s[i + 1:i + 3]) for i, c in enumerate(s) if c == "%")


def validator(schema):
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    return cls(schema, format_checker=FORMATS)


def serializations(x):
    return [json.dumps(x), json.dumps(x, indent=2), json.dumps(x, separators=(",", ":")),
            json.dumps(x, indent=4, ensure_ascii=False)]


def schema_files():
    return sorted(SCHEMAS.glob("*.json"))


def load(stem):
    return json.loads((SCHEMAS / f"{stem}.json").read_text())


# ---------------------------------------------------------------------------------------------
# The corpus


def test_corpus_and_cases_agree():
    stems = {p.stem for p in schema_files()}
    assert len(stems) >= 40
    assert stems == set(CASES), stems ^ set(CASES)
    readme = (SCHEMAS / "README.md").read_text()
    for s in stems:
        assert f"{s}.json" in readme, s
    for stem, (valid, invalid) in CASES.items():
        assert len(valid) >= 3 and len(invalid) >= 3, stem


@pytest.mark.parametrize("stem", sorted(CASES))
def test_schema_corpus(stem):
    schema = load(stem)
    regex, relaxed = schema_to_regex(schema)  # strict mode: every corpus schema compiles
    rx = re.compile(regex)
    v = validator(schema)
    valid, invalid = CASES[stem]
    for x in valid:
        assert v.is_valid(x), (stem, x, [e.message for e in v.iter_errors(x)])
        for s in serializations(x):
            assert rx.fullmatch(s), (stem, s)
    for x in invalid:
        assert not v.is_valid(x), (stem, x)
        for s in serializations(x):
            assert not rx.fullmatch(s), (stem, s)


# ---------------------------------------------------------------------------------------------
# Soundness under random mutation: whatever the regex accepts must be valid

_NOISE = ['"', ",", "0", "9", "-", ".", "e", "E", "+", " ", "\n", "{", "}", "[", "]", ":", "a", "Z",
          "\\", "é", "null", "true", "1", "/", "\\u00e9", "\\n", "_", "@"]


def _text_mutations(s, rng, n):
    out = []
    for _ in range(n):
        t = s
        for _ in range(rng.choice([1, 1, 1, 2, 3])):
            i = rng.randrange(len(t) + 1)
            op = rng.random()
            if op < 0.3 and t:
                t = t[:i] + t[i + 1:]
            elif op < 0.6:
                t = t[:i] + rng.choice(_NOISE) + t[i:]
            elif op < 0.8 and t:
                t = t[:i] + rng.choice(_NOISE) + t[i + 1:]
            else:
                j = rng.randrange(len(t) + 1)
                a, b = sorted((i, j))
                t = t[:a] + t[a:b] * 2 + t[b:]
        out.append(t)
    return out


_SCALARS = [None, True, False, 0, -1, 1, 0.5, -0.5, 1e-9, 99, 100, 101, 130, 65536, 2**63, -2**63, 1.5,
            "", "a", "x" * 300, "ABC-123", "2024-02-30", "2024-02-29", "a@b", "::", "1.2.3.4", [], {},
            [1], {"k": 1}, "read", "read"]


def _value_mutations(x, rng, n):
    out = []
    for _ in range(n):
        y = copy.deepcopy(x)
        paths = []

        def walk(node, path):
            paths.append(path)
            if isinstance(node, dict):
                for k, v in node.items():
                    walk(v, path + [k])
            elif isinstance(node, list):
                for i, v in enumerate(node):
                    walk(v, path + [i])

        walk(y, [])
        path = rng.choice(paths)
        parent = None
        node = y
        for p in path:
            parent, node = node, node[p]
        op = rng.random()
        new = copy.deepcopy(rng.choice(_SCALARS))
        if isinstance(node, (int, float)) and not isinstance(node, bool) and op < 0.4:
            new = node + rng.choice([-1, 1, -0.5, 0.5, 1e-7, -1e-7, 10**6])
        elif isinstance(node, str) and op < 0.4:
            new = node + rng.choice(["", "x", " ", "é", "-", "0"]) if rng.random() < 0.5 else node[:-1]
        elif isinstance(node, dict) and op < 0.5:
            if node and rng.random() < 0.5:
                node.pop(rng.choice(list(node)))
            else:
                node[rng.choice(["zzz", "name", "id", "extra"])] = rng.choice(_SCALARS)
            new = node
        elif isinstance(node, list) and op < 0.5:
            if node and rng.random() < 0.5:
                node.append(copy.deepcopy(rng.choice(node)))
            elif node:
                node.pop()
            else:
                node.append(rng.choice(_SCALARS))
            new = node
        if parent is None:
            y = new
        else:
            parent[path[-1]] = new
        out.append(y)
    return out


@pytest.mark.parametrize("stem", sorted(CASES))
def test_mutations_are_sound(stem):
    schema = load(stem)
    rx = re.compile(schema_to_regex(schema)[0])
    v = validator(schema)
    rng = random.Random(hash(stem) & 0xFFFF)
    accepted = 0
    for x in CASES[stem][0]:
        texts = []
        for s in serializations(x)[:3]:
            texts += _text_mutations(s, rng, 40)
        for y in _value_mutations(x, rng, 40):
            texts += serializations(y)[:3]
        for t in texts:
            if rx.fullmatch(t):
                accepted += 1
                parsed = json.loads(t)  # must be JSON
                assert v.is_valid(parsed), (stem, t, [e.message for e in v.iter_errors(parsed)])
    assert accepted > 0


# ---------------------------------------------------------------------------------------------
# outlines-core compatibility: every corpus regex builds an Index (Rust regex dialect)


def test_corpus_builds_outlines_index():
    outlines_core = pytest.importorskip("outlines_core")
    vocab = outlines_core.Vocabulary(999, {bytes([b]): [b] for b in list(range(32, 127)) + [9, 10]})
    t0 = time.time()
    for path in schema_files():
        regex, _ = schema_to_regex(json.loads(path.read_text()))
        index = outlines_core.Index(regex, vocab)
        assert index.get_final_states(), path.name
    print(f"outlines-core Index for {len(schema_files())} schemas: {time.time() - t0:.2f}s")


def test_maskbench_dev_regex_soundness():
    """MaskBench's dev split at the regex level (json.dumps(data, ensure_ascii=False), as MaskBench
    feeds it): no invalid instance may match a strictly compiled schema."""
    require_corpus(MASKBENCH)
    counts = dict(schemas=0, compiled=0, errors=0, too_large=0, valid=0, valid_accepted=0, invalid=0,
                  approx_violations=0)
    violations = []
    for f in sorted(MASKBENCH.glob("*.json")):
        d = json.loads(f.read_text())
        counts["schemas"] += 1
        try:  # a lower size limit than the default keeps Python's re (a backtracker) quick here
            r = compile_json_schema(d["schema"], max_regex_chars=60_000)
        except GrammarError as e:
            counts["errors"] += 1
            counts["too_large"] += "too large" in str(e)
            continue
        if r.unique_items:  # kept by the matcher beside the regex (json/test_unique.py), not by it
            continue
        counts["compiled"] += 1
        rx = re.compile(r.regex)
        approx = any(x.startswith("oneOf") for x in r.relaxed)
        for t in d["tests"]:
            hit = rx.fullmatch(json.dumps(t["data"], ensure_ascii=False)) is not None
            if t["valid"]:
                counts["valid"] += 1
                counts["valid_accepted"] += hit
            else:
                counts["invalid"] += 1
                if hit and approx:
                    counts["approx_violations"] += 1
                elif hit:
                    violations.append((f.name, t.get("description")))
    print("MaskBench dev (regex level):", counts)
    assert not violations, violations


# ---------------------------------------------------------------------------------------------
# Keyword-level behaviour


def rx_of(schema, **kw):
    return re.compile(schema_to_regex(schema, **kw)[0])


def test_default_whitespace_admits_compact_default_and_indented_output():
    schema = {"type": "object", "properties": {"a": {"type": "array", "items": {"type": "object", "properties": {
        "b": {"type": "array", "items": {"type": "array", "items": {"type": "object", "properties": {
            "c": {"type": "integer"}}}}}}}}}}
    x = {"a": [{"b": [[{"c": 1}, {"c": 2}], []]}, {"b": []}]}  # 5 levels of containers
    rx = rx_of(schema)
    for s in serializations(x) + [json.dumps(x, indent=4), json.dumps(x, indent="\t"),
                                  '{ "a" : [ { "b" : [ [ { "c" : 1 } , { "c" : 2 } ] , [ ] ] } , { "b" : [ ] } ] }']:
        assert rx.fullmatch(s), s
    for s in ['{"a":  []}', '{"a": []} ', ' {"a": []}', '{\n' + " " * 25 + '"a": []}', '{"a"\n: []}', '{\n\n"a": []}']:
        assert not rx.fullmatch(s), s
    assert "*" not in DEFAULT_WS_BREAK and "+" not in DEFAULT_WS_BREAK


def test_whitespace_pattern_override():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "array", "items": {"type": "null"}}}}
    compact = rx_of(schema, whitespace_pattern="")
    assert compact.fullmatch('{"a":1,"b":[null,null]}')
    assert not compact.fullmatch('{"a": 1}')
    spaced = rx_of(schema, whitespace_pattern="[ ]?")
    assert spaced.fullmatch('{ "a" : 1 , "b" : [ null ] }') and not spaced.fullmatch('{\n"a": 1}')
    with pytest.raises(GrammarError, match="whitespace_pattern"):
        schema_to_regex(schema, whitespace_pattern="(")


def test_schema_as_json_string_and_errors():
    assert schema_to_regex('{"type": "integer", "minimum": 0}')[0] == schema_to_regex({"type": "integer", "minimum": 0})[0]
    with pytest.raises(GrammarError, match="not valid JSON"):
        schema_to_regex('{"type": ')
    with pytest.raises(GrammarError):
        schema_to_regex("[1, 2]")
    with pytest.raises(GrammarError, match="invalid 'type'"):
        schema_to_regex({"type": "text"})
    with pytest.raises(GrammarError, match="'minimum' at /properties/n must be a number"):
        schema_to_regex({"properties": {"n": {"minimum": "3"}}})


def test_annotations_and_unknown_keywords_are_ignored():
    base = {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}
    noisy = {"$schema": "https://json-schema.org/draft/2020-12/schema", "$id": "https://example.com/s.json",
             "title": "T", "description": "D", "$comment": "c", "examples": [{"a": "x"}], "default": {"a": "y"},
             "deprecated": False, "x-vendor": 1, "nullable": True, "type": "object",
             "properties": {"a": {"type": "string", "readOnly": True, "writeOnly": False, "contentMediaType": "text/plain",
                                  "contentEncoding": "base64", "title": "A", "examples": ["q"]}},
             "required": ["a"]}
    assert schema_to_regex(noisy) == schema_to_regex(base)
    assert schema_to_regex(noisy)[1] == []


def test_unsupported_keywords_strict_and_lenient():
    schema = {"type": "object", "properties": {"tags": {"type": "array", "uniqueItems": True},
                                               "n": {"type": "integer", "multipleOf": 7}}}
    with pytest.raises(GrammarError) as e:
        schema_to_regex(schema)
    assert str(e.value).startswith("unsupported uniqueItems at /properties/tags")
    regex, relaxed = schema_to_regex(schema, lenient=True)
    assert any(r.startswith("uniqueItems at /properties/tags") for r in relaxed)
    assert any(r.startswith("multipleOf at /properties/n (more than 1000 multiples of 7") for r in relaxed)
    for kw, val in [("not", {"pattern": "^a"}), ("propertyNames", {"maxLength": 3})]:
        s = {"type": "object", "properties": {"a": {}}, "additionalProperties": True, kw: val}
        with pytest.raises(GrammarError, match=kw):
            schema_to_regex(s)
    with pytest.raises(GrammarError, match="'if' at /"):
        schema_to_regex({"if": {"pattern": "^a"}, "then": {"minLength": 1}})
    assert schema_to_regex({"type": "string", "then": {"minLength": 1}})[0] == schema_to_regex({"type": "string"})[0]


def _key_spellings(key: str, rng: random.Random) -> list[str]:
    """JSON spellings of a key: compact, \\u-escaped non-ASCII (surrogate pairs), `\\/`, and
    upper-case hex; never a \\u escape of printable ASCII (left out by design)."""
    def escaped(c: str) -> str:
        if c == "/":
            return "\\/"
        if ord(c) < 0x80:
            return json.dumps(c)[1:-1]
        units = c.encode("utf-16-be")
        hexes = ["%04x" % int.from_bytes(units[i:i + 2], "big") for i in range(0, len(units), 2)]
        return "".join("\\u" + (h.upper() if rng.random() < 0.5 else h) for h in hexes)
    return [json.dumps(key), json.dumps(key, ensure_ascii=False),
            '"' + "".join(escaped(c) if rng.random() < 0.5 else json.dumps(c, ensure_ascii=False)[1:-1]
                          for c in key) + '"']


def test_undeclared_keys_never_spell_a_declared_name():
    names = ["a", "ab", "café", "a/b", 'q"x', "t\tb", "\U0001F600", ""]
    schema = {"type": "object", "properties": {n: {"type": "integer"} for n in names},
              "additionalProperties": {"type": "string"}}
    rx = rx_of(schema)
    rng = random.Random(0)
    for _ in range(600):
        key = rng.choice(names) if rng.random() < 0.3 else \
            "".join(rng.choice("abcé/\"\tq\U0001F600") for _ in range(rng.randint(0, 4)))
        for text in _key_spellings(key, rng):
            assert bool(rx.fullmatch("{" + text + ': "v"}')) == (key not in names), text


def test_refs_local_forms():
    schema = {
        "$id": "https://example.com/root.json",
        "$defs": {"a/b": {"type": "integer"}, "t~x": {"type": "boolean"}, "p%q": {"type": "null"},
                  "anch": {"$anchor": "named", "type": "string", "maxLength": 2}},
        "definitions": {"old": {"enum": ["o"]}},
        "type": "object",
        "properties": {
            "slash": {"$ref": "#/$defs/a~1b"}, "tilde": {"$ref": "#/$defs/t~0x"}, "pct": {"$ref": "#/$defs/p%25q"},
            "anchor": {"$ref": "#named"}, "old": {"$ref": "#/definitions/old"},
            "absolute": {"$ref": "https://example.com/root.json#/$defs/a~1b"}, "relative": {"$ref": "root.json#/definitions/old"},
        },
        "required": ["slash", "tilde", "pct", "anchor", "old", "absolute", "relative"],
    }
    rx = rx_of(schema)
    good = {"slash": 1, "tilde": True, "pct": None, "anchor": "ab", "old": "o", "absolute": -3, "relative": "o"}
    assert rx.fullmatch(json.dumps(good))
    for k, bad in [("slash", "1"), ("tilde", 0), ("pct", 0), ("anchor", "abc"), ("old", "p"), ("absolute", 1.5)]:
        assert not rx.fullmatch(json.dumps({**good, k: bad})), k
    root = {"type": "object", "properties": {"x": {"type": "integer"}, "self": {"$ref": "#/properties/x"}}}
    assert rx_of(root).fullmatch('{"x": 1, "self": 2}')


def test_refs_to_draft_4_to_7_fragment_ids():
    """Before $anchor, a subschema named itself with a fragment-only id: "$id": "#name" (drafts
    6, 7) or "id": "#name" (draft 4); such an id starts no new resource."""
    schema = {"definitions": {"small": {"$id": "#small", "type": "integer", "maximum": 9},
                              "word": {"id": "#word", "type": "string", "maxLength": 3},
                              "both": {"$ref": "#/definitions/small"}},
              "type": "object", "properties": {"n": {"$ref": "#small"}, "w": {"$ref": "#word"},
                                               "b": {"$ref": "#/definitions/both"}},
              "required": ["n", "w", "b"], "additionalProperties": False}
    rx = rx_of(schema)
    assert rx.fullmatch(json.dumps({"n": 9, "w": "abc", "b": 0}))
    for bad in ({"n": 10, "w": "a", "b": 0}, {"n": 1, "w": "abcd", "b": 0}, {"n": 1, "w": "a", "b": "x"}):
        assert not rx.fullmatch(json.dumps(bad)), bad


def test_recursive_schemas_raise_for_the_grammar_path_and_remote_refs_raise():
    tree = {"$defs": {"node": {"type": "object", "properties": {"value": {"type": "integer"},
                                                              "children": {"type": "array", "items": {"$ref": "#/$defs/node"}}}}},
            "$ref": "#/$defs/node"}
    for lenient in (False, True):
        with pytest.raises(RecursiveSchemaError, match=r"recursive schema \(cycle through #/\$defs/node\)"):
            schema_to_regex(tree, lenient=lenient)
    with pytest.raises(RecursiveSchemaError, match="recursive"):
        schema_to_regex({"properties": {"again": {"$ref": "#"}}})
    with pytest.raises(RecursiveSchemaError, match="recursive"):
        schema_to_regex({"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"})
    for ref in ["http://example.com/s.json", "file:///etc/schema.json", "other.json#/x"]:
        with pytest.raises(GrammarError, match="remote \\$ref .*never fetched"):
            schema_to_regex({"properties": {"a": {"$ref": ref}}})
    with pytest.raises(GrammarError, match="does not resolve"):
        schema_to_regex({"properties": {"a": {"$ref": "#/$defs/missing"}}})


def test_ref_siblings_are_merged():
    schema = {"$defs": {"s": {"type": "string", "minLength": 2}},
              "type": "object", "properties": {"a": {"$ref": "#/$defs/s", "maxLength": 3, "pattern": "^[a-z]+$"}},
              "required": ["a"]}
    rx = rx_of(schema)
    assert rx.fullmatch('{"a": "ab"}') and rx.fullmatch('{"a": "abc"}')
    for v in ["a", "abcd", "AB"]:
        assert not rx.fullmatch(json.dumps({"a": v})), v


def test_allof_is_merged_not_concatenated():
    schema = {"allOf": [
        {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0}}, "required": ["a"]},
        {"type": "object", "properties": {"a": {"maximum": 10}, "b": {"type": "string"}}, "required": ["b"]},
        {"type": ["object", "null"], "properties": {"b": {"maxLength": 3}}},
    ]}
    rx = rx_of(schema)
    v = validator(schema)
    assert rx.fullmatch('{"a": 5, "b": "xyz"}')
    for x in [{"a": 11, "b": "x"}, {"a": -1, "b": "x"}, {"a": 1, "b": "long"}, {"a": 1}, {"b": "x"}, None]:
        assert not v.is_valid(x) and not rx.fullmatch(json.dumps(x)), x
    assert not rx.fullmatch('{"a": 5}{"b": "xyz"}')
    # additionalProperties of one branch applies to the other branch's properties
    closed = {"allOf": [{"properties": {"a": {}}, "additionalProperties": False}, {"properties": {"b": {}}}]}
    rx = rx_of(closed)
    assert rx.fullmatch('{"a": 1}') and not rx.fullmatch('{"a": 1, "b": 2}')
    with pytest.raises(GrammarError, match="allOf at / is unsatisfiable"):
        schema_to_regex({"allOf": [{"const": 1}, {"const": 2}]})
    with pytest.raises(GrammarError, match="allOf at /properties/x is unsatisfiable"):
        schema_to_regex({"type": "object", "properties": {"x": {"allOf": [{"type": "string"}, {"type": "integer"}]}},
                         "required": ["x"]})
    # an unsatisfiable optional property is left out instead
    rx = rx_of({"type": "object", "properties": {"x": {"allOf": [{"type": "string"}, {"type": "integer"}]},
                                                 "y": {"type": "null"}}})
    assert rx.fullmatch('{"y": null}') and not rx.fullmatch('{"x": 1}')


def test_anyof_and_oneof():
    nullable = rx_of({"anyOf": [{"type": "integer", "minimum": 1}, {"type": "null"}]})
    assert nullable.fullmatch("3") and nullable.fullmatch("null") and not nullable.fullmatch("0")
    disjoint = {"oneOf": [{"type": "string"}, {"type": "integer"}, {"properties": {"k": {"const": 1}}, "required": ["k"],
                                                                    "type": "object"}]}
    assert schema_to_regex(disjoint)[1] == []
    overlapping = {"oneOf": [{"type": "integer"}, {"type": "integer", "minimum": 2}]}
    with pytest.raises(GrammarError, match="oneOf at /: the branches are not provably exclusive"):
        schema_to_regex(overlapping)
    regex, relaxed = schema_to_regex(overlapping, lenient=True)
    assert relaxed == ["oneOf at / (compiled as anyOf: branches not provably exclusive)"]
    ranges = {"oneOf": [{"type": "number", "maximum": 0}, {"type": "number", "exclusiveMinimum": 0}]}
    assert schema_to_regex(ranges)[1] == []
    # siblings of anyOf are honoured in every branch
    rx = rx_of({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                "anyOf": [{"required": ["a"]}, {"required": ["b"]}]})
    assert rx.fullmatch('{"a": 1}') and rx.fullmatch('{"b": 1}') and rx.fullmatch('{"a": 1, "b": 2}')
    assert not rx.fullmatch("{}")


def test_integers_and_numbers():
    integer = rx_of({"type": "integer"})
    for s in ["0", "-1", "12345678901234567890"]:
        assert integer.fullmatch(s)
    for s in ["-0", "01", "1.0", "1e3", "+1", ""]:
        assert not integer.fullmatch(s), s
    number = rx_of({"type": "number"})
    for s in ["0", "-0", "-0.0", "1.5", "1e-7", "-2.5E+10", "12345678901234567890.123"]:
        assert number.fullmatch(s), s
    for s in [".5", "5.", "1e", "--1", "NaN", "Infinity", "0x1"]:
        assert not number.fullmatch(s), s
    bounded = rx_of({"type": "number", "minimum": 0, "maximum": 1})
    assert bounded.fullmatch("0.25") and not bounded.fullmatch("1e-1")  # bounded numbers have no exponent
    draft4 = rx_of({"type": "integer", "minimum": 1, "exclusiveMinimum": True, "maximum": 3, "exclusiveMaximum": True})
    assert [s for s in ["0", "1", "2", "3", "4"] if draft4.fullmatch(s)] == ["2"]
    frac_bounds = rx_of({"type": "integer", "minimum": 1.5, "maximum": 4.5})
    assert [s for s in map(str, range(0, 6)) if frac_bounds.fullmatch(s)] == ["2", "3", "4"]


def test_exclusive_bounds_survive_float_parsing():
    schema = {"type": "number", "exclusiveMaximum": 1, "exclusiveMinimum": 0}
    rx, v = rx_of(schema), validator(schema)
    for s in ["0.5", "0.99999999999999", "0.00000000000001"]:
        assert rx.fullmatch(s) and v.is_valid(json.loads(s)), s
    for s in ["0.99999999999999999", "0.999999999999999999999", "0." + "0" * 400 + "1"]:
        assert not rx.fullmatch(s), s  # json.loads would round these onto a bound
    big = rx_of({"type": "number", "exclusiveMaximum": 1e15})
    assert big.fullmatch("999999999999999") and not big.fullmatch("999999999999999.9")


def test_enum_and_const_of_any_value():
    rx = rx_of({"enum": [None, True, 0, -2.5, "a\"b", [1, {"k": []}], {"x": {"y": None}}]})
    for x in [None, True, 0, 0.0, -2.5, "a\"b", [1, {"k": []}], {"x": {"y": None}}]:
        for s in serializations(x):
            assert rx.fullmatch(s), s
    for x in [False, 1, -2.4, "ab", [1], [1, {"k": [0]}], {"x": {"y": 0}}, {}]:
        assert not rx.fullmatch(json.dumps(x)), x
    assert rx_of({"const": 1}).fullmatch("1.0")
    assert not rx_of({"const": 1}).fullmatch("true")
    # enum values must also pass the sibling keywords
    rx = rx_of({"type": "string", "enum": ["a", "bbbb", 3], "maxLength": 3})
    assert rx.fullmatch('"a"') and not rx.fullmatch('"bbbb"') and not rx.fullmatch("3")
    with pytest.raises(GrammarError, match="unsatisfiable"):
        schema_to_regex({"type": "integer", "enum": ["a"]})


def test_object_property_policy():
    declared = rx_of({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}})
    assert declared.fullmatch("{}") and declared.fullmatch('{"b": 1}') and declared.fullmatch('{"a": 1, "b": 2}')
    assert not declared.fullmatch('{"b": 1, "a": 2}')  # declared order
    assert not declared.fullmatch('{"c": 1}')  # no undeclared keys by default
    assert not declared.fullmatch('{"a": 1, "a": 2}')
    free = compile_json_schema({"type": "object"})
    assert any("additionalProperties" in r for r in free.relaxed)
    assert re.fullmatch(free.regex, '{"anything": [1, "x"], "b": {"c": null}}')
    assert not re.fullmatch(free.regex, '{"anything": [1, {"x": null}]}')  # deeper than ANY_VALUE_DEPTH
    req = rx_of({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a", "z"]})
    assert req.fullmatch('{"a": 1, "z": [true]}') and not req.fullmatch('{"a": 1}')


def test_additional_keys_never_spell_a_declared_name():
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "né": {"type": "string"}},
              "additionalProperties": {"type": "integer"}}
    rx, v = rx_of(schema), validator(schema)
    assert rx.fullmatch('{"name": "a", "nam": 1, "names": 2, "x": 3, "": 4}')
    for s in ['{"name": "a", "name": 1}', '{"name": 1}', '{"nam\\u0065": 1}', '{"n\\u00e9": 1}', '{"né": 1}',
              '{"\\u006eame": 5}']:
        assert not rx.fullmatch(s), s
    for s in ['{"n\\u00e9x": 1}', '{"nameé": 1}']:
        assert rx.fullmatch(s) and v.is_valid(json.loads(s)), s


def test_arrays():
    rx = rx_of({"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 3})
    assert [n for n in range(5) if rx.fullmatch(json.dumps(list(range(n))))] == [2, 3]
    tup = rx_of({"prefixItems": [{"type": "integer"}, {"type": "string"}]})
    assert tup.fullmatch("[]") and tup.fullmatch("[1]") and tup.fullmatch('[1, "a", null, [2]]')
    assert not tup.fullmatch('["a"]')
    r = compile_json_schema({"type": "array", "items": {"type": "integer"}, "maxItems": 10000})
    assert r.narrowed and "10000" in r.narrowed[0]
    assert re.fullmatch(r.regex, json.dumps(list(range(64)))) and not re.fullmatch(r.regex, json.dumps(list(range(65))))
    assert compile_json_schema({"type": "array"}).relaxed == ["any value at /items (JSON nested at most 1 deep)"]
    assert rx_of({"type": "array", "items": False}).fullmatch("[]")
    with pytest.raises(GrammarError, match="unsatisfiable"):
        schema_to_regex({"type": "array", "items": False, "minItems": 1})


def test_unique_items():
    rx = rx_of({"type": "array", "items": {"enum": [1, "a", None]}, "uniqueItems": True, "minItems": 2})
    v = validator({"type": "array", "items": {"enum": [1, "a", None]}, "uniqueItems": True, "minItems": 2})
    import itertools

    for n in range(5):
        for seq in itertools.product([1, "a", None], repeat=n):
            assert (rx.fullmatch(json.dumps(list(seq))) is not None) == v.is_valid(list(seq)), seq
    tuple_ok = {"type": "array", "prefixItems": [{"type": "integer"}, {"type": "string"}], "items": False, "uniqueItems": True}
    assert schema_to_regex(tuple_ok)[1] == []
    strings = compile_json_schema({"type": "array", "items": {"type": "string"}, "uniqueItems": True})
    assert strings.unique_items == [""] and strings.relaxed == []  # left to the matcher (json.unique)
    with pytest.raises(GrammarError, match="uniqueItems at /"):
        schema_to_regex({"type": "array", "items": {"type": "object"}, "uniqueItems": True})
    regex, relaxed = schema_to_regex({"type": "array", "items": {"type": "object"}, "uniqueItems": True}, lenient=True)
    assert any(r.startswith("uniqueItems at /") for r in relaxed)
    assert rx_of({"type": "array", "items": {"type": "string"}, "uniqueItems": True, "maxItems": 1}).fullmatch('["x"]')


def test_property_counts():
    one = rx_of({"type": "object", "properties": {"a": {}, "b": {}}, "minProperties": 1})
    assert not one.fullmatch("{}") and one.fullmatch('{"b": 1}')
    implied = {"type": "object", "properties": {"a": {}}, "required": ["a"], "minProperties": 1, "maxProperties": 1}
    assert schema_to_regex(implied)[1] == ["any value at /properties/a (JSON nested at most 2 deep)"]
    with pytest.raises(GrammarError, match="minProperties"):
        schema_to_regex({"type": "object", "properties": {"a": {}, "b": {}, "c": {}}, "minProperties": 2})
    small_map = rx_of({"type": "object", "additionalProperties": {"type": "integer"}, "maxProperties": 2})
    assert small_map.fullmatch("{}") and small_map.fullmatch('{"a": 1, "b": 2}')
    assert not small_map.fullmatch('{"a": 1, "b": 2, "c": 3}')
    assert rx_of({"type": "object", "additionalProperties": True, "maxProperties": 0}).fullmatch("{}")


def test_any_value_is_depth_limited_and_reported():
    r = compile_json_schema({})
    assert r.relaxed == ["any value at / (JSON nested at most 2 deep)"]
    rx = re.compile(r.regex)
    for x in [None, 1, "s", [1, [2]], {"a": {"b": 1}}, [{"a": 1}]]:
        assert rx.fullmatch(json.dumps(x)), x
    assert not rx.fullmatch(json.dumps([[[1]]])) and not rx.fullmatch(json.dumps([{"a": []}]))
    assert schema_to_regex(True)[0] == r.regex
    with pytest.raises(GrammarError, match="unsatisfiable"):
        schema_to_regex(False)


def test_regex_size_limit():
    wide = {"type": "object", "properties": {f"p{i}": {"type": "integer", "minimum": 0, "maximum": 999}
                                             for i in range(60)}, "additionalProperties": True}
    regex, _ = schema_to_regex(wide)
    with pytest.raises(RegexTooLargeError, match="too large"):
        schema_to_regex(wide, max_regex_chars=len(regex) - 1)
    # found where a subschema's regex alone passes the limit, not once the whole is written
    with pytest.raises(RegexTooLargeError, match="wide alone has"):
        schema_to_regex({"type": "array", "items": {"properties": {"wide": wide}}}, max_regex_chars=len(regex) - 1)
    # short, but 60 strings of up to 200 characters written out: ~470k positions to index
    long_strings = {"type": "object", "properties": {f"p{i}": {"type": "string", "maxLength": 200} for i in range(60)}}
    with pytest.raises(RegexTooLargeError, match="expands to"):
        schema_to_regex(long_strings)


@pytest.mark.parametrize("schema, values", [
    ({"type": "integer", "enum": [0, 1, -3]}, [0, 1, -3]),
    ({"type": "integer", "const": 2.0}, [2]),
    ({"allOf": [{"type": "integer"}, {"enum": [4, 5.0]}]}, [4, 5]),
    ({"type": ["integer", "string"], "enum": [1, "a"]}, [1]),
])
def test_integer_enum_values_have_no_fraction(schema, values):
    """An enum or const under a `type` without "number" is written as integers: drafts 4 and
    older read 1.0 as no integer (a draft-04 schema's validator refuses it)."""
    rx = compile_json_schema(schema, None, False).regex
    for v in values:
        assert re.fullmatch(rx, str(v)) and not re.fullmatch(rx, f"{v}.0")
    draft4 = {"$schema": "http://json-schema.org/draft-04/schema#", **schema}
    assert not re.fullmatch(compile_json_schema(draft4, None, False).regex, f"{values[0]}.0")


def test_number_enum_values_keep_their_spellings():
    rx = compile_json_schema({"enum": [0, 1.5]}, None, False).regex
    assert all(re.fullmatch(rx, text) for text in ("0", "0.0", "1.5", "1.50"))
