// Loopback OAuth 2.0 authorization server for mcpcreds tests (oidc-provider 9).
//
// Usage: node server.mjs config.json   (or JSON in env OIDC_PEER_CONFIG)
// Config: {"port": 0, "access_token_ttl": 5, "clients": [{client_id, client_secret,
//          token_endpoint_auth_method, jwks, scope, grant_types, redirect_uris}]}
// Clients with grant_types device_code / authorization_code (+ refresh_token) log in through the
// devInteractions pages (any login name and password; consent by a form POST); PKCE is required
// and refresh tokens rotate on every use (a used one is refused: invalid_grant). Dynamic client
// registration (RFC 7591) is open at /reg; a registered client may ask for any configured scope.
// Prints exactly one stdout line when listening: "READY <issuer>".
//
// Test-only endpoints (no auth, loopback only):
//   GET  /_test/stats                      -> {token_requests, token_issued, by_client}
//   POST /_test/reset_stats
//   POST /_test/ttl                        {"seconds": N}
//   POST /_test/clients/<id>/secret        {"client_secret": "...", "keep_old": bool}
//   POST /_test/clients/<id>/drop_old

import { generateKeyPairSync, timingSafeEqual, createHash } from 'node:crypto';
import { readFileSync } from 'node:fs';
import http from 'node:http';

import Provider, { errors } from 'oidc-provider';

// Keep stdout for the READY line only: oidc-provider prints notices via console.info.
console.info = (...args) => console.error(...args);
console.log = (...args) => console.error(...args);

const raw = process.argv[2] ? readFileSync(process.argv[2], 'utf8') : process.env.OIDC_PEER_CONFIG;
if (!raw) {
  console.error('usage: node server.mjs config.json (or set OIDC_PEER_CONFIG)');
  process.exit(2);
}
const config = JSON.parse(raw);

const state = {
  ttl: Number(config.access_token_ttl ?? 5),
  secrets: new Map(), // client_id -> [current, old?]
  stats: { token_requests: 0, token_issued: 0, by_client: {} },
};

const clients = (config.clients ?? []).map((c) => {
  const method = c.token_endpoint_auth_method ?? 'client_secret_basic';
  const grantTypes = c.grant_types ?? ['client_credentials'];
  const meta = {
    client_id: c.client_id,
    token_endpoint_auth_method: method,
    grant_types: grantTypes,
    response_types: grantTypes.includes('authorization_code') ? ['code'] : [],
    redirect_uris: c.redirect_uris ?? [],
    scope: c.scope ?? '',
  };
  if ((c.redirect_uris ?? []).some((u) => u.startsWith('http://127.0.0.1'))) {
    meta.application_type = 'native'; // RFC 8252: any loopback port
  }
  if (method === 'private_key_jwt') {
    meta.jwks = c.jwks;
  } else if (method === 'none') {
    // a public client: no secret
  } else {
    if (typeof c.client_secret !== 'string' || !c.client_secret) {
      console.error(`client ${c.client_id}: client_secret required for ${method}`);
      process.exit(2);
    }
    meta.client_secret = c.client_secret;
    state.secrets.set(c.client_id, [c.client_secret]);
  }
  return meta;
});

const allScopes = new Set();
for (const c of clients) c.scope.split(' ').filter(Boolean).forEach((s) => allScopes.add(s));

// Fresh signing key each run; its public part is served at jwks_uri.
const { privateKey } = generateKeyPairSync('rsa', { modulusLength: 2048 });
const signingJwk = { ...privateKey.export({ format: 'jwk' }), kid: 'peer-rs256', use: 'sig', alg: 'RS256' };

function resourceAllowed(resource) {
  let url;
  try {
    url = new URL(resource);
  } catch {
    return false;
  }
  if (url.protocol === 'https:') return true;
  return url.protocol === 'http:' && ['127.0.0.1', 'localhost', '[::1]'].includes(url.hostname);
}

function sha(s) {
  return createHash('sha256').update(String(s)).digest();
}

function clientIdOf(ctx) {
  if (ctx.oidc?.client?.clientId) return ctx.oidc.client.clientId;
  const auth = ctx.headers.authorization;
  if (auth?.toLowerCase().startsWith('basic ')) {
    const decoded = Buffer.from(auth.slice(6), 'base64').toString('utf8');
    const i = decoded.indexOf(':');
    if (i > 0) {
      try { return decodeURIComponent(decoded.slice(0, i)); } catch { return decoded.slice(0, i); }
    }
  }
  const params = ctx.oidc?.params;
  if (params?.client_id) return params.client_id;
  if (params?.client_assertion) {
    try {
      return JSON.parse(Buffer.from(params.client_assertion.split('.')[1], 'base64url')).sub ?? 'unknown';
    } catch { /* fall through */ }
  }
  return 'unknown';
}

async function readJson(req) {
  const chunks = [];
  for await (const chunk of req) chunks.push(chunk);
  const text = Buffer.concat(chunks).toString('utf8');
  return text ? JSON.parse(text) : {};
}

const server = http.createServer();
await new Promise((resolve) => server.listen(Number(config.port ?? 0), '127.0.0.1', resolve));
const issuer = `http://127.0.0.1:${server.address().port}`;

const provider = new Provider(issuer, {
  clients,
  jwks: { keys: [signingJwk] },
  scopes: [...allScopes],
  clientAuthMethods: ['client_secret_basic', 'client_secret_post', 'private_key_jwt', 'none'],
  cookies: { keys: ['mcpcreds-oidc-peer-test-cookie-key'] },
  enabledJWA: {
    clientAuthSigningAlgValues: ['RS256', 'PS256', 'ES256', 'ES384', 'EdDSA'],
  },
  pkce: { required: () => true },
  issueRefreshToken: async (ctx, client) => client.grantTypeAllowed('refresh_token'),
  rotateRefreshToken: () => true,
  features: {
    devInteractions: { enabled: true },
    deviceFlow: { enabled: true },
    revocation: { enabled: true },
    registration: { enabled: true }, // open dynamic client registration (RFC 7591)
    clientCredentials: { enabled: true },
    introspection: { enabled: true },
    resourceIndicators: {
      enabled: true,
      defaultResource: async () => undefined,
      useGrantedResource: async () => true,
      getResourceServerInfo: async (ctx, resourceIndicator, client) => {
        if (!resourceAllowed(resourceIndicator)) {
          throw new errors.InvalidTarget('resource not allowed by test peer');
        }
        return {
          scope: client.scope ?? [...allScopes].join(' '), // a registered client: any scope
          audience: resourceIndicator,
          accessTokenFormat: 'jwt',
          jwt: { sign: { alg: 'RS256' } },
        };
      },
    },
  },
  ttl: {
    AccessToken: () => state.ttl,
    ClientCredentials: () => state.ttl,
    DeviceCode: 600,
    RefreshToken: 3600,
    Grant: 3600,
  },
});

// Secret rotation: compare against every currently accepted secret of the client.
provider.Client.prototype.compareClientSecret = function compareClientSecret(actual) {
  const accepted = state.secrets.get(this.clientId) ?? [];
  return accepted.some((s) => timingSafeEqual(sha(s), sha(actual)));
};

const tokenPath = new URL(provider.urlFor('token')).pathname;
const devicePath = new URL(provider.urlFor('device_authorization')).pathname;

provider.use(async (ctx, next) => {
  if (ctx.path.startsWith('/_test/')) {
    const reply = (body, status = 200) => { ctx.status = status; ctx.body = body; };
    const m = /^\/_test\/clients\/([^/]+)\/(secret|drop_old)$/.exec(ctx.path);
    if (ctx.method === 'GET' && ctx.path === '/_test/stats') {
      return reply(state.stats);
    }
    if (ctx.method === 'POST' && ctx.path === '/_test/reset_stats') {
      state.stats = { token_requests: 0, token_issued: 0, by_client: {} };
      return reply(state.stats);
    }
    if (ctx.method === 'POST' && ctx.path === '/_test/ttl') {
      const { seconds } = await readJson(ctx.req);
      if (!Number.isInteger(seconds) || seconds < 1) return reply({ error: 'seconds must be a positive integer' }, 400);
      state.ttl = seconds;
      return reply({ seconds });
    }
    if (ctx.method === 'POST' && m) {
      const clientId = decodeURIComponent(m[1]);
      const current = state.secrets.get(clientId);
      if (!current) return reply({ error: 'unknown client or client has no secret' }, 404);
      if (m[2] === 'drop_old') {
        state.secrets.set(clientId, [current[0]]);
      } else {
        const body = await readJson(ctx.req);
        if (typeof body.client_secret !== 'string' || !body.client_secret) {
          return reply({ error: 'client_secret required' }, 400);
        }
        state.secrets.set(clientId, body.keep_old ? [body.client_secret, current[0]] : [body.client_secret]);
      }
      return reply({ client_id: clientId, accepted_secrets: state.secrets.get(clientId).length });
    }
    return reply({ error: 'not found' }, 404);
  }

  if (ctx.method === 'POST' && ctx.path === devicePath) {
    await next();
    // RFC 8628 polls every 5 s unless told otherwise: tests poll every second
    if (ctx.status === 200 && ctx.body && typeof ctx.body === 'object') ctx.body.interval = Number(config.device_interval ?? 1);
    return undefined;
  }
  if (ctx.method === 'POST' && ctx.path === tokenPath) {
    state.stats.token_requests += 1;
    try {
      await next();
    } finally {
      const id = clientIdOf(ctx);
      state.stats.by_client[id] = (state.stats.by_client[id] ?? 0) + 1;
      const assertion = ctx.oidc?.params?.client_assertion;
      if (assertion) {
        try {
          const [h, p] = assertion.split('.').slice(0, 2).map((x) => JSON.parse(Buffer.from(x, 'base64url')));
          state.stats.assertions = state.stats.assertions ?? {};
          state.stats.assertions[id] = { alg: h.alg, aud: p.aud, lifetime: p.exp - p.iat, ok: ctx.status === 200 };
        } catch { /* not a JWT: the provider refused it */ }
      }
      const grantType = ctx.oidc?.params?.grant_type;
      if (grantType) state.stats.by_grant = { ...(state.stats.by_grant ?? {}), [grantType]: (state.stats.by_grant?.[grantType] ?? 0) + 1 };
      if (ctx.status === 200) state.stats.token_issued += 1;
    }
    return undefined;
  }
  return next();
});

provider.on('server_error', (ctx, err) => console.error('server_error', err));

server.on('request', provider.callback());

const shutdown = () => server.close(() => process.exit(0));
process.on('SIGTERM', shutdown);
process.on('SIGINT', shutdown);

process.stdout.write(`READY ${issuer}\n`);
