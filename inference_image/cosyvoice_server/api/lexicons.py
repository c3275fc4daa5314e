"""GET /v1/audio/lexicons: the pronunciation lexicons a request can name (`"lexicons": [...]`)."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse

from .auth import require_api_key
from .openai import error_responses, ready_or_503, state_of
from .schemas import LexiconCard, LexiconList

router = APIRouter(prefix="/v1", dependencies=[Depends(require_api_key)], tags=["lexicons"],
                   responses=error_responses(401, 503))


@router.get("/audio/lexicons", responses={200: {"model": LexiconList}})
async def list_lexicons(request: Request) -> JSONResponse:
    s = state_of(request)
    ready_or_503(s)
    store = s.lexicons
    cards = []
    for name, entry in sorted(store.entries.items()):
        lex = entry.lexicon
        cards.append(LexiconCard(
            id=name, default=name in store.defaults, graphemes=len(lex.entries) if lex else 0,
            alphabet=lex.alphabet if lex else None, lang=lex.lang if lex else None, error=entry.error))
    return JSONResponse(LexiconList(data=cards, defaults=list(store.defaults)).model_dump())
