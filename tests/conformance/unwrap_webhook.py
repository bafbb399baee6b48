"""Verify a webhook the devserver sent with the official SDK's
`client.beta.webhooks.unwrap`, then check that a tampered body is refused.

Environment: WEBHOOK_SECRET, WEBHOOK_BODY, WEBHOOK_ID, WEBHOOK_TIMESTAMP,
WEBHOOK_SIGNATURE.
"""

import os
import sys

import anthropic

client = anthropic.Anthropic(api_key="unused")
headers = {
    "webhook-id": os.environ["WEBHOOK_ID"],
    "webhook-timestamp": os.environ["WEBHOOK_TIMESTAMP"],
    "webhook-signature": os.environ["WEBHOOK_SIGNATURE"],
}
body = os.environ["WEBHOOK_BODY"]
event = client.beta.webhooks.unwrap(body, headers=headers, key=os.environ["WEBHOOK_SECRET"])
print(f"{event.data.type} {event.data.id}")

try:
    client.beta.webhooks.unwrap(body.replace("run_started", "run_startet"), headers=headers, key=os.environ["WEBHOOK_SECRET"])
except Exception as e:  # standardwebhooks.WebhookVerificationError
    print(f"tampered body refused: {type(e).__name__}")
else:
    print("a tampered body was accepted")
    sys.exit(1)
