"""The URL configuration of the Django test app (see apps.py): the views
find the app instance's side-effect counter in the request's environ."""

from __future__ import annotations

import json
import time
from typing import Any

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.urls import path


def charge(request: HttpRequest, account: int) -> HttpResponse:
    effects = request.META["idem_test.effects"]
    if request.method == "GET":
        return JsonResponse({"count": len(effects.charges)})
    n = effects.charge(json.loads(request.body))
    time.sleep(0.05)
    resp = JsonResponse({"charge": f"ch_{n}", "account": account}, status=201)
    resp["Location"] = f"/charges/{n}"
    resp.set_cookie("session", "secret")
    return resp


def boom(request: HttpRequest) -> HttpResponse:
    request.META["idem_test.effects"].charge("boom")
    raise RuntimeError("handler failed")


def fail(request: HttpRequest) -> HttpResponse:
    request.META["idem_test.effects"].charge("fail")
    return JsonResponse({"error": "upstream down"}, status=502)


def gated(request: HttpRequest) -> HttpResponse:
    effects = request.META["idem_test.effects"]
    n = effects.charge(json.loads(request.body))
    effects.gate.wait(30)
    return JsonResponse({"charge": f"ch_{n}"}, status=201)


urlpatterns: list[Any] = [
    path("gated", gated),
    path("charges/<int:account>", charge),
    path("boom", boom),
    path("fail", fail),
]
