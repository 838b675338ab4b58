from django.http import HttpResponse

from shop.models import Order
from shop.tasks import record


def create_order(request):
    """Under ATOMIC_REQUESTS: the order and its task commit together, or neither does."""
    order = Order.objects.create(item=request.GET.get("item", "mug"))
    result = record.enqueue(order.id)
    if request.GET.get("fail"):
        raise RuntimeError("the request fails after enqueueing")
    return HttpResponse(result.id)
