# Django behind idem, in one file: pip install ./clients/python django
import json
import os
import sys

from django.conf import settings
from django.core.management import execute_from_command_line
from django.http import JsonResponse
from django.urls import path
from django.views.decorators.csrf import csrf_exempt

settings.configure(DEBUG=False, ALLOWED_HOSTS=["127.0.0.1", "localhost"], ROOT_URLCONF=__name__,
                   SECRET_KEY="example-only", WSGI_APPLICATION=__name__ + ".application")
charges = []


@csrf_exempt
def charge(request):
    order = json.loads(request.body)
    charges.append(order)  # the side effect: runs once per key
    print(f"charged {order['amount']} (charge {len(charges)})", flush=True)
    return JsonResponse({"charge": f"ch_{len(charges)}", "amount": order["amount"]}, status=201)


urlpatterns = [path("charges", charge)]

from django.core.wsgi import get_wsgi_application  # noqa: E402 (after settings.configure)

from idem import Client  # noqa: E402
from idem.wsgi import install_django  # noqa: E402

idem = Client(os.environ["IDEM_URL"], token=os.environ["IDEM_TOKEN"])
application = install_django(get_wsgi_application(), idem)

if __name__ == "__main__":
    execute_from_command_line([sys.argv[0], "runserver", "--noreload", "127.0.0.1:" + os.environ.get("PORT", "8000")])
