import { existsSync } from "node:fs";
import { release } from "node:os";
import { join } from "node:path";
import type { Server } from "bun";
import pkg from "../package.json" with { type: "json" };
import { createApp } from "./app.ts";
import { type Config, dataPaths } from "./config.ts";
import { Keystore, KeystoreError } from "./crypto/keystore.ts";
import { SecretBox } from "./crypto/secret-box.ts";
import type { Deps } from "./deps.ts";
import { AdjustableClock, type Clock, systemClock } from "./domain/clock.ts";
import { IdGenerator } from "./domain/ids.ts";
import { unwritableDataDir } from "./fs/writable-dir.ts";
import { kernelWakesPrecisely } from "./http/answer-floor.ts";
import { clientAddress } from "./http/client-address.ts";
import { errorBody } from "./http/envelope.ts";
import { ApiError } from "./http/errors.ts";
import { IdempotencyStore } from "./http/idempotency.ts";
import { type Logger, loggedPath } from "./http/logger.ts";
import { Metrics } from "./http/metrics.ts";
import { pathOf } from "./http/request-path.ts";
import { testClockRoutes } from "./http/test-clock.ts";
import { startSweeper } from "./jobs/sweeper.ts";
import { startUsageFlusher } from "./jobs/usage-flush.ts";
import { WebhookDispatcher } from "./jobs/webhook-dispatcher.ts";
import { createMailTransport, DEFAULT_MAIL_FROM } from "./mail/transport.ts";
import { MailWorker } from "./mail/worker.ts";
import { passkeyBaseUrlProblem, passkeysMayBeUsed } from "./modules/named-users/passkeys.ts";
import { createServices } from "./services.ts";
import { cannotListen, filesWrittenInPlace, StartupError } from "./startup-checks.ts";
import { startCheckpointer } from "./store/checkpointer.ts";
import { undecryptableValue } from "./store/data-key.ts";
import { type Store, unusableStoreFile } from "./store/db.ts";
import { openMigratedStore, StoreOpenElsewhere } from "./store/migrate-alone.ts";
import { type ServeLock, takeServeLock } from "./store/serve-lock.ts";

/**
 * A backstop only: Bun refuses larger bodies with a bare 413 before any of our code runs. Routes
 * enforce their own, much smaller limits while streaming, and answer with the error envelope.
 */
export const MAX_REQUEST_BODY_BYTES = 64 * 1024 * 1024;
/** How long SIGTERM waits for in-flight requests before closing what is left. */
export const DRAIN_TIMEOUT_MS = 10_000;

export interface RunningServer {
  url: string;
  /** Resolves once a shutdown has completed (store closed). */
  closed: Promise<void>;
  /** Stops accepting, drains in-flight requests (bounded), closes the store. Idempotent. */
  shutdown(reason: string): Promise<void>;
}

export interface StartOptions {
  config: Config;
  passphrase: string;
  logger: Logger;
}

/** Wrong passphrase, tampered or missing keystore: one clear line, never a stack trace. */
export function openKeystore(dataDir: string, passphrase: string): Keystore {
  try {
    return Keystore.open(dataPaths(dataDir).keystore, passphrase);
  } catch (error) {
    if (error instanceof KeystoreError) throw new StartupError(`cannot open the keystore: ${error.message}`);
    throw error;
  }
}

export function buildDeps(store: Store, keystore: Keystore, clock: Clock = systemClock): Deps {
  return {
    db: store.db,
    sqlite: store.sqlite,
    clock,
    ids: new IdGenerator(),
    secrets: new SecretBox(keystore.secret("data-key")),
    keystore,
  };
}

function openServedStore(config: Config, logger: Logger): Store {
  const path = dataPaths(config.dataDir).store;
  if (!existsSync(path)) {
    throw new StartupError(`no store at ${path}, but a keystore exists; restore the store from a backup`);
  }
  const unusable = unusableStoreFile(path);
  if (unusable) {
    throw new StartupError(
      `the store ${path} ${unusable}, but a keystore exists; restore the store from a backup`,
    );
  }
  try {
    // Migrations run over a connection that has the store alone (migrate-alone.ts): a server from
    // before serve.lock, or a command, may have it open.
    const { store, result } = openMigratedStore(path);
    logger.log("info", "store ready", { path, applied: result.applied, schema: result.current });
    return store;
  } catch (error) {
    if (error instanceof StoreOpenElsewhere) {
      throw new StartupError(
        `the store ${path} needs migrations, and another process has it open: a server older than ` +
          "this executable (from before serve.lock) or a command; stop it, then start this one (nothing was migrated)",
      );
    }
    // Not SQLite at all (overwritten, truncated to nothing useful): say which file.
    throw new StartupError(`cannot use the store ${path}: ${(error as Error).message}`);
  }
}

/**
 * Opens keystore and store, migrates, builds the app and listens. Nothing listens unless every
 * earlier step succeeded, so a wrong passphrase or a tampered keystore never serves a request.
 */
export function startServer(options: StartOptions): RunningServer {
  const unwritable = unwritableDataDir(options.config.dataDir, filesWrittenInPlace(options.config.dataDir));
  if (unwritable) throw new StartupError(unwritable);
  const keystore = openKeystore(options.config.dataDir, options.passphrase);
  const lockPath = dataPaths(options.config.dataDir).serveLock;
  let lock: ServeLock | null;
  try {
    lock = takeServeLock(lockPath);
  } catch (error) {
    throw new StartupError(
      `cannot take the server's lock ${lockPath}: ${(error as Error).message}; ` +
        "while no licensing serve runs on this directory, the file can be deleted",
    );
  }
  if (!lock) {
    throw new StartupError(
      `another licensing serve is running on ${options.config.dataDir} (it holds ${lockPath}); ` +
        "stop it first: two servers on one data directory would each grant the plan's allowances",
    );
  }
  try {
    const running = serveWithLock(options, keystore);
    void running.closed.then(() => lock.release());
    return running;
  } catch (error) {
    lock.release();
    throw error;
  }
}

function serveWithLock({ config, logger }: StartOptions, keystore: Keystore): RunningServer {
  const store = openServedStore(config, logger);
  // A keystore of another install opens with its own passphrase; without this, every read of a
  // license would answer 500 instead of the server refusing to start.
  const unreadable = undecryptableValue(store.sqlite, new SecretBox(keystore.secret("data-key")));
  if (unreadable) {
    store.close();
    throw new StartupError(
      `the keystore's data key does not decrypt the store's secrets (${unreadable}): ` +
        `${dataPaths(config.dataDir).keystore} is not the keystore of this store; ` +
        "put back the one that belongs with it (restore both from one backup)",
    );
  }
  const checkpointer = startCheckpointer(store.sqlite, dataPaths(config.dataDir).store, {
    onRestart: ({ heldMs, checkpointMs, caughtUp, databaseSyncMs }) =>
      logger.log(caughtUp ? "debug" : "info", "wal restart", {
        writes_held_ms: Math.round(heldMs * 1000) / 1000,
        checkpoint_ms: Math.round(checkpointMs * 1000) / 1000,
        database_sync_ms: Math.round(databaseSyncMs * 1000) / 1000,
        caught_up: caughtUp,
      }),
    onError: (message) => logger.log("warn", "wal checkpoint worker", { error: message }),
  });
  const kernel = release();
  if (kernelWakesPrecisely(process.platform, kernel) === false)
    logger.log("warn", "verification starts' 5 ms answer floor is coarser on this kernel", {
      kernel,
      needs: "Linux 5.11 or later (epoll_pwait2) for sub-millisecond wake-ups",
    });
  void checkpointer.ready.then((running) =>
    running
      ? logger.log("info", "wal checkpoints run in the background")
      : logger.log("warn", "background wal checkpoints unavailable; sqlite checkpoints inside commits"),
  );
  let shuttingDown = false;
  let inFlight = 0;
  let server: Server<undefined> | undefined;
  let stopSweeper: () => void = () => {};
  let stopUsageFlusher: () => void = () => {};
  let flushUsage: () => void = () => {};
  let stopMail: () => Promise<void> = async () => {};
  let stopWebhooks: () => Promise<void> = async () => {};
  try {
    const clock: Clock = config.testClock ? new AdjustableClock() : systemClock;
    const deps = buildDeps(store, keystore, clock);
    const swept = new IdempotencyStore(store.sqlite, clock).sweep({ abandonInFlight: true });
    if (swept > 0) logger.log("info", "idempotency records swept", { removed: swept });

    const services = createServices(deps, {
      baseUrl: config.baseUrl,
      sealedFileEnvironments: config.sealedFileEnvironments,
      webhookAllowPrivateNetworks: config.webhookAllowPrivateNetworks,
      logger,
    });
    // Kept only when someone may scrape them: otherwise no request pays for counting.
    const metrics = config.metricsToken ? new Metrics({ version: pkg.version, sqlite: store.sqlite }) : null;
    const base = createApp(
      deps,
      {
        baseUrl: config.baseUrl,
        testClock: config.testClock,
        runtimeRateLimits: config.runtimeRateLimits,
        trustForwardedFor: config.trustForwardedFor,
        logger,
        readiness: { ready: () => !shuttingDown },
        metrics:
          metrics && config.metricsToken ? { registry: metrics, token: config.metricsToken } : undefined,
      },
      services,
    );
    // What `licensing billing status` and `licensing offline issue` name the service by.
    services.workspace.recordBaseUrl(config.baseUrl);
    // Products left pending by a crash get their keys, and stale records go, before any request.
    stopSweeper = startSweeper(services, logger);
    // Mail left pending by an earlier process (a crash, an SMTP outage) goes out now.
    const mailTransport = createMailTransport({
      smtpUrl: config.smtpUrl,
      outboxDir: join(config.dataDir, "outbox"),
    });
    stopMail = new MailWorker(deps, mailTransport, {
      from: config.mailFrom ?? DEFAULT_MAIL_FROM,
      logger,
    }).start(services.mail);
    logger.log("info", "mail transport", { transport: mailTransport.description });
    // Deliveries left queued or cut off by an earlier process resume here (at least once).
    const webhookDispatcher = new WebhookDispatcher(deps, {
      logger,
      allowPrivateNetworks: config.webhookAllowPrivateNetworks,
    });
    stopWebhooks = webhookDispatcher.start();
    metrics?.collect(() => webhookDispatcher.metricLines());
    flushUsage = () => services.usageMeter.flush();
    // Answered calls are on disk within 5 seconds even when no further request comes.
    stopUsageFlusher = startUsageFlusher(services.usageMeter, logger);
    // The WAL is restarted by holding the device calls' shared commits for a moment (checkpointer.ts).
    checkpointer.restartWith(services.groupCommit);
    const app = clock instanceof AdjustableClock ? base.use(testClockRoutes(clock)) : base;
    metrics?.useRoutes(app.routes);
    const passkeyProblem = passkeyBaseUrlProblem(config.baseUrl);
    if (passkeyProblem) {
      // Everything else works; only named users' passkeys need a base URL browsers accept. A
      // warning on every default start, where nothing uses them, would teach operators to ignore it.
      logger.log(passkeysMayBeUsed(deps.db) ? "warn" : "info", "passkeys cannot work with this base URL", {
        base_url: config.baseUrl,
        reason: passkeyProblem.reason,
        fix: passkeyProblem.message,
      });
    }
    if (config.testClock) {
      logger.log(
        "warn",
        "test clock enabled: POST /testing/v1/clock moves time forward; never use in production",
      );
    }

    const fetch = async (received: Request, peer: Server<undefined>): Promise<Response> => {
      inFlight++;
      // HTTP/1.0 without a Host header, or with an empty one (load balancers' health probes send
      // these): Bun gives such a request its path alone as the URL. It is served like any other,
      // under an absolute URL, so that the router and every hook find the same path in it.
      let request = received;
      if (received.url.startsWith("/")) {
        request = new Request(`http://localhost${received.url}`, received);
        // The server knows the socket of the request it handed over, not of a copy: asked now.
        clientAddress.set(request, peer.requestIP(received)?.address);
      } else {
        // Before the app: the per-address runtime limits ask it for the socket's peer, if ever.
        clientAddress.setSource(request, peer);
      }
      const started = performance.now();
      let response: Response;
      try {
        response = await app.handle(request);
      } catch (error) {
        // The app turns every error into an envelope; reaching here is a bug, still answered as one.
        const requestId = deps.ids.next("request", Date.now());
        logger.log("error", "request failed outside the app", {
          request_id: requestId,
          error: (error as Error).message,
        });
        response = new Response(
          JSON.stringify(
            errorBody(new ApiError("INTERNAL_ERROR", "Unexpected server error."), requestId, config.baseUrl),
          ),
          { status: 500, headers: { "content-type": "application/json", "x-request-id": requestId } },
        );
      } finally {
        inFlight--;
      }
      // Only named fields: headers (Authorization above all) and bodies are never logged.
      logger.log("info", "request", {
        request_id: response.headers.get("x-request-id"),
        method: request.method,
        path: loggedPath(pathOf(request.url)),
        status: response.status,
        duration_ms: Math.round((performance.now() - started) * 1000) / 1000,
      });
      metrics?.observe(request.method, pathOf(request.url), response, (performance.now() - started) / 1000);
      return response;
    };

    try {
      server = Bun.serve({
        hostname: config.host,
        port: config.port,
        maxRequestBodySize: MAX_REQUEST_BODY_BYTES,
        // Stated explicitly: a second instance on the same port must fail, not share the traffic.
        reusePort: false,
        development: false,
        fetch,
      });
    } catch (error) {
      throw cannotListen(config, error);
    }
  } catch (error) {
    stopSweeper();
    stopUsageFlusher();
    void stopMail();
    void stopWebhooks();
    // The database file's own descriptor last: closing it drops SQLite's locks (checkpointer.ts).
    void checkpointer.stop().then(() => checkpointer.closeDatabaseFile());
    store.close();
    throw error;
  }

  const listening = server;
  let resolveClosed: () => void = () => {};
  const closed = new Promise<void>((resolve) => {
    resolveClosed = resolve;
  });
  let shutdownPromise: Promise<void> | undefined;

  const drain = async (): Promise<void> => {
    const stopped = listening.stop();
    const deadline = performance.now() + DRAIN_TIMEOUT_MS;
    while (inFlight > 0 && performance.now() < deadline) await Bun.sleep(10);
    if (inFlight > 0) {
      logger.log("warn", "shutdown: in-flight requests did not finish in time", { in_flight: inFlight });
    }
    // Idle keep-alive connections would otherwise hold the stop promise open.
    await Promise.race([stopped, Bun.sleep(100)]);
    await listening.stop(true);
  };

  return {
    url: `http://${config.host.includes(":") ? `[${config.host}]` : config.host}:${listening.port}`,
    closed,
    shutdown(reason) {
      shutdownPromise ??= (async () => {
        shuttingDown = true;
        stopSweeper();
        logger.log("info", "shutting down", { reason, in_flight: inFlight });
        try {
          await drain();
          // A send in progress finishes and is marked; anything left stays pending for the next start.
          await stopMail();
          await stopWebhooks();
        } finally {
          try {
            // After the drain, so the requests that finished during it are counted too. It may
            // fail (a command holding the write lock past the busy timeout): the store still
            // closes, and `closed` (with the serve lock) is still let go.
            stopUsageFlusher();
            flushUsage();
          } catch (error) {
            logger.log("error", "shutdown: usage not recorded", { error: (error as Error).message });
          }
          try {
            await checkpointer.stop();
            store.close();
            checkpointer.closeDatabaseFile();
            logger.log("info", "stopped");
          } finally {
            resolveClosed();
          }
        }
      })();
      return shutdownPromise;
    },
  };
}
