"""The secret formats redaction must remove (issue 17 item 7): one row per format, with where it
is placed (a log line, a container argument, an env entry) and the strings that must never
reach any sink. Shared by the unit table (tests/diagnosis/test_redaction_matrix.py) and the
end-to-end one through `serve` (tests/http/test_redaction_matrix_e2e.py)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Format:
    name: str
    secrets: tuple[str, ...]  # none of these may appear at any sink
    log: str | None = None  # the text placed in the crashed container's log
    env: tuple[str, str] | None = None  # (name, value) placed in the container's env
    args: tuple[str, ...] = field(default=())  # a --flag for the vLLM container's args, else a sidecar's command


def F(name: str, secret: str | tuple[str, ...], log: str | None = None, env: tuple[str, str] | None = None,
      args: tuple[str, ...] = ()) -> Format:
    return Format(name, (secret,) if isinstance(secret, str) else secret, log, env, args)


ZW = "\u200b"
FORMATS: tuple[Format, ...] = (
    # ---- covered before issue 17 ----
    F("aws access key id", "AKIAQWERTYUIOPASDFGH", log="using AWS key AKIAQWERTYUIOPASDFGH for the bucket"),
    F("aws session key id", "ASIAY34FZKBOKMUTVV7A", log="key id ASIAY34FZKBOKMUTVV7A in use"),
    F("jwt", "c2lnbmF0dXJlLXNlY3JldC12YWx1ZQ",
      log="bearer token accepted: eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJvbmNhbGwtdGVzdCJ9.c2lnbmF0dXJlLXNlY3JldC12YWx1ZQ"),
    F("vllm api_key list", "vllmkey-LOGLIST-4f9a8b7c",
      log="non-default args: {'model': 'meta-llama/Llama-3.1-8B-Instruct', 'api_key': ['vllmkey-LOGLIST-4f9a8b7c']}"),
    F("Namespace api_key", "nskey-abc123-namespace", log="args: Namespace(host=None, api_key='nskey-abc123-namespace')"),
    F("json password", "JsonPassw0rd-8c7d6e", log='loaded {"user": "svc", "password": "JsonPassw0rd-8c7d6e"}'),
    F("json client_secret", "cl1ent-s3cret-json", log='{"client_secret": "cl1ent-s3cret-json"}'),
    F("url password", "UrlPassw0rd-5b4a39", log="connecting to postgres://svc:UrlPassw0rd-5b4a39@db.internal:5432/x"),
    F("x-api-key header", "xak-HEADER-1a2b3c4d5e", log="request headers: x-api-key: xak-HEADER-1a2b3c4d5e"),
    F("Authorization Bearer", "abc.def.ghi-bearer-77", log="Authorization: Bearer abc.def.ghi-bearer-77"),
    F("Authorization Basic", "YWxhZGRpbjpvcGVuc2VzYW1l", log="authorization: Basic YWxhZGRpbjpvcGVuc2VzYW1l"),
    F("google api key", "AIzaSyB-redactiontest0123456789abcdefgh", log="maps key AIzaSyB-redactiontest0123456789abcdefgh"),
    F("pem private key", "MIIEowIBAAKCAQEA7redactionPEMbodyLINEsecretXYZ0123456789abcdefghijklmnopq",
      log="-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA7redactionPEMbodyLINEsecretXYZ0123456789abcdefghijklmnopq\n"
          "-----END RSA PRIVATE KEY-----"),
    F("slack bot token", "xoxb-1234567890-1234567890123-AbCdEfGhIjKl",
      log="SLACK_BOT_TOKEN is xoxb-1234567890-1234567890123-AbCdEfGhIjKl"),
    F("slack app token", "xapp-1-A0123456789-1234567890123-abcdef0123456789",
      log="app token xapp-1-A0123456789-1234567890123-abcdef0123456789"),
    F("slack webhook", "T0000/B0000/XXXXWEBHOOKXXXXXXXXXXXXXX",
      log="posting to https://hooks.slack.com/services/T0000/B0000/XXXXWEBHOOKXXXXXXXXXXXXXX"),
    F("hugging face token", "hf_LogTokenRedactionTest0123456789", log="login with hf_LogTokenRedactionTest0123456789"),
    F("openai key", "sk-proj-abcdefghijklmnop1234", log="OPENAI_API_KEY='sk-proj-abcdefghijklmnop1234'"),
    F("github token", "ghp_a1B2c3D4e5a1B2c3D4e5a1B2c3D4e5f6G7h8",
      log="git clone https://ghp_a1B2c3D4e5a1B2c3D4e5a1B2c3D4e5f6G7h8@github.com/org/repo"),
    F("github fine-grained pat", "github_pat_11ABCDEFG0123456789_abcdefghij",
      log="token github_pat_11ABCDEFG0123456789_abcdefghij"),
    F("gitlab pat", "glpat-abcdefghij0123456789", log="glpat-abcdefghij0123456789 in use"),
    F("*_TOKEN assignment", "abc123notaknownformat", log="HF_TOKEN=abc123notaknownformat"),
    F("*SECRET* name", "opensesame-secret-thing", log="MY_SECRET_THING: opensesame-secret-thing"),
    F("--api-key argument", "argkey-SPACE-77aa88bb", args=("--api-key", "argkey-SPACE-77aa88bb")),
    F("--hf-token= argument", "hf_ArgTokenRedactionTest0123456789", args=("--hf-token=hf_ArgTokenRedactionTest0123456789",)),
    F("*_KEY env", "envkey-SERVICE-0f1e2d3c", env=("SERVICE_KEY", "envkey-SERVICE-0f1e2d3c")),
    F("*PASSWORD* env", "envpw-DATABASE-9a8b7c", env=("DB_PASSWORD", "envpw-DATABASE-9a8b7c")),
    # ---- issue 17: survived before ----
    F("NGC api key", "nvapi-NgcRedactionTest0123456789abcdefXYZ", log="ngc config set nvapi-NgcRedactionTest0123456789abcdefXYZ"),
    F("google oauth token", "ya29.a0AfH6SMBOauthRedactionTest0123456789",
      log="gcs: access token ya29.a0AfH6SMBOauthRedactionTest0123456789 refreshed"),
    F("azure sas sig=", "sasSig0123456789RedactionAbCd%3D",
      log="blob https://acct.blob.core.windows.net/models/x?sv=2022-11-02&se=2026-12-01&sig=sasSig0123456789RedactionAbCd%3D"),
    F("redis empty-user url", "RedisPw-0a1b2c3d", log="cache at redis://:RedisPw-0a1b2c3d@redis.internal:6379/0"),
    F("gitlab runner token", "glrt-RunnerRedactionTest0123456789", log="runner registered glrt-RunnerRedactionTest0123456789"),
    F("Cookie header", "sessionid=CookieSess-9f8e7d6c", log="request headers: Cookie: sessionid=CookieSess-9f8e7d6c; theme=dark"),
    F("mysql -p in a log", "MyLogPw-55aa66bb", log="+ mysql -h db.internal -u root -pMyLogPw-55aa66bb -e 'select 1'"),
    F("mysql -p in sh -c", "MyShPw-77cc88dd",
      args=("/bin/sh", "-c", "mysql -h db -u root -pMyShPw-77cc88dd -e 'select 1' && exec sleep infinity")),
    F("DB_PASS env", "dbpass-Value-1234", env=("DB_PASS", "dbpass-Value-1234")),
    F("DB_PW env", "dbpw-Value-5678", env=("DB_PW", "dbpw-Value-5678")),
    F("MODEL_CREDS env", "modelcreds-Value-9abc", env=("MODEL_CREDS", "modelcreds-Value-9abc")),
    F("REDIS_URL env", "redisurl-Value-def0", env=("REDIS_URL", "redis://default:redisurl-Value-def0@redis:6379/1")),
    F("AZURE_STORAGE_SAS env", "azsas-Value-ghij", env=("AZURE_STORAGE_SAS", "azsas-Value-ghij")),
    F("stripe live key", "sk_live_StripeRedaction0123456789", log="billing key sk_live_StripeRedaction0123456789"),
    F("replicate token", "r8_ReplicateRedactionTest0123456789", log="REPLICATE: r8_ReplicateRedactionTest0123456789"),
    F("wandb login", "0123456789abcdef0123456789abcdef01234567", log="+ wandb login 0123456789abcdef0123456789abcdef01234567"),
    F("docker config auth", "ZG9ja2VyOmRvY2tlclB3LTAx",
      log='{"auths": {"registry.example": {"auth": "ZG9ja2VyOmRvY2tlclB3LTAx"}}}'),
    F("bare aws secret key", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYREDACTKEY1",
      log="aws secret wJalrXUtnFEMI/K7MDENG/bPxRfiCYREDACTKEY1 loaded"),
    F("password with @", ("P@ss@Word-At-1", "Word-At-1"), log="db mysql://app:P@ss@Word-At-1@db.internal:3306/app"),
    F("base64 credentials", "c3ZjLXVzZXI6YjY0LVNlY3JldC1QdzE=", log="creds blob c3ZjLXVzZXI6YjY0LVNlY3JldC1QdzE= decoded"),
    F("zero-width inside a token", ("hf_ZeroWidthRedaction0123456789", "WidthRedaction0123456789"),
      log=f"login with hf_Zero{ZW}WidthRedaction0123456789"),
    F("token split across lines", ("hf_Split0001", "Half0002Tail0003RedactX"), log="token hf_Split0001\nHalf0002Tail0003RedactX"),
)
assert len(FORMATS) == 49 and len({f.name for f in FORMATS}) == 49
