/* Small helpers: time, strings, base64, topic tests, MQTT v5 properties <-> JSON. */
#include <stdlib.h>
#include <string.h>

#include "util.h"

/* Wall-clock time (event timestamps, session expiry as Mosquitto keeps it). */
int64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Monotonic time for durations (leases, ages, periods): a clock step does not move it. */
int64_t mono_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Whether a rate-limited message may be logged now (at most one per `period_ms`); counts
 * the ones held back, which the caller reports with the next line (*held, then reset). */
bool ratelog_due(struct ratelog *r, int64_t period_ms, uint64_t *held)
{
	int64_t now = mono_ms();

	if(r->logged && now - r->last_ms < period_ms){
		r->held++;
		return false;
	}
	*held = r->held;
	r->held = 0;
	r->last_ms = now;
	r->logged = true;
	return true;
}

/* A hybrid logical clock's next value (wall ms << 16, always above *last, which it updates). */
uint64_t hlc_next(uint64_t *last)
{
	uint64_t h = (uint64_t)now_ms() << 16;

	if(h <= *last) h = *last + 1;
	*last = h;
	return h;
}

/* Whether `given` is `expected`, in a time that does not depend on where they differ. */
bool secret_equal(const char *given, const char *expected)
{
	size_t a, b, i;
	unsigned char diff = 0;

	if(given == NULL || expected == NULL) return false;
	a = strlen(given);
	b = strlen(expected);
	for(i = 0; i < a && i < b; i++) diff |= (unsigned char)(given[i] ^ expected[i]);
	return diff == 0 && a == b;
}

/* The string member `key` of a JSON object (NULL: none, or not a string). */
const char *cjson_get_str(const cJSON *o, const char *key)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);

	return cJSON_IsString(v) ? v->valuestring : NULL;
}

char *xstrdup(const char *s)
{
	return s ? strdup(s) : NULL;
}

bool streq(const char *a, const char *b)
{
	if(a == NULL || b == NULL) return a == b;
	return strcmp(a, b) == 0;
}

static const char b64_alphabet[] =
	"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

char *b64_encode(const void *data, size_t len, size_t *out_len)
{
	const unsigned char *in = data;
	size_t olen = 4 * ((len + 2) / 3);
	char *out = malloc(olen + 1);
	size_t i, j = 0;

	if(out == NULL) return NULL;
	for(i = 0; i + 2 < len; i += 3){
		uint32_t v = ((uint32_t)in[i] << 16) | ((uint32_t)in[i+1] << 8) | in[i+2];
		out[j++] = b64_alphabet[(v >> 18) & 63];
		out[j++] = b64_alphabet[(v >> 12) & 63];
		out[j++] = b64_alphabet[(v >> 6) & 63];
		out[j++] = b64_alphabet[v & 63];
	}
	if(i < len){
		uint32_t v = (uint32_t)in[i] << 16;
		if(i + 1 < len) v |= (uint32_t)in[i+1] << 8;
		out[j++] = b64_alphabet[(v >> 18) & 63];
		out[j++] = b64_alphabet[(v >> 12) & 63];
		out[j++] = (i + 1 < len) ? b64_alphabet[(v >> 6) & 63] : '=';
		out[j++] = '=';
	}
	out[j] = '\0';
	if(out_len) *out_len = j;
	return out;
}

static int b64_value(char c)
{
	if(c >= 'A' && c <= 'Z') return c - 'A';
	if(c >= 'a' && c <= 'z') return c - 'a' + 26;
	if(c >= '0' && c <= '9') return c - '0' + 52;
	if(c == '+') return 62;
	if(c == '/') return 63;
	return -1;
}

/* Strict standard base64 (padding optional). Returns 0 on success; *out is malloc'd (may be
 * a 1-byte buffer for an empty input). */
int b64_decode(const char *in, unsigned char **out, size_t *out_len)
{
	size_t len = strlen(in);
	size_t i, n = 0;
	uint32_t acc = 0;
	int bits = 0;
	unsigned char *buf;

	while(len > 0 && in[len-1] == '=') len--;
	if(strlen(in) - len > 2) return -1;
	buf = malloc(len * 3 / 4 + 1);
	if(buf == NULL) return -1;
	for(i = 0; i < len; i++){
		int v = b64_value(in[i]);
		if(v < 0){
			free(buf);
			return -1;
		}
		acc = (acc << 6) | (uint32_t)v;
		bits += 6;
		if(bits >= 8){
			bits -= 8;
			buf[n++] = (unsigned char)((acc >> bits) & 0xFF);
		}
	}
	if(bits >= 6){ /* a single dangling character cannot encode a byte */
		free(buf);
		return -1;
	}
	*out = buf;
	*out_len = n;
	return 0;
}

/* True if `topic` is `root` or lies below it ("root/..."). */
bool topic_in_subtree(const char *topic, const char *root)
{
	size_t rl = strlen(root);

	if(topic == NULL) return false;
	if(strncmp(topic, root, rl) != 0) return false;
	return topic[rl] == '\0' || topic[rl] == '/';
}

/* The filter without a "$share/<group>/" prefix (itself when it has none). */
const char *strip_share(const char *filter)
{
	const char *p;

	if(strncmp(filter, "$share/", 7) != 0) return filter;
	p = strchr(filter + 7, '/');
	return p ? p + 1 : filter;
}

/* A fast 64-bit hash (not cryptographic; seeded per plugin start). */
uint64_t hash_bytes(uint64_t h, const void *data, size_t len)
{
	const unsigned char *b = data;
	uint64_t w;

	h ^= (uint64_t)len * 0x9e3779b97f4a7c15ULL;
	while(len >= 8){
		memcpy(&w, b, 8);
		h = (h ^ w) * 0xff51afd7ed558ccdULL;
		h = (h << 31) | (h >> 33);
		b += 8;
		len -= 8;
	}
	w = 0;
	if(len) memcpy(&w, b, len);
	h = (h ^ w) * 0xc4ceb9fe1a85ec53ULL;
	h ^= h >> 33;
	h *= 0xff51afd7ed558ccdULL;
	h ^= h >> 33;
	return h;
}

void cjson_add_str_or_null(cJSON *o, const char *key, const char *v)
{
	if(v){
		cJSON_AddStringToObject(o, key, v);
	}else{
		cJSON_AddNullToObject(o, key);
	}
}

void cjson_add_expiry(cJSON *o, const char *key, int64_t v)
{
	if(v < 0){
		cJSON_AddNullToObject(o, key);
	}else{
		cJSON_AddNumberToObject(o, key, (double)v);
	}
}

/* The MQTT v5 message properties we forward, as the protocol's `properties` object. */
cJSON *properties_to_json(const mosquitto_property *props)
{
	cJSON *o = cJSON_CreateObject();
	cJSON *user = NULL;
	const mosquitto_property *p;

	if(o == NULL) return NULL;
	for(p = props; p; p = mosquitto_property_next(p)){
		int id = mosquitto_property_identifier(p);
		char *s = NULL, *k = NULL;
		void *bin = NULL;
		uint16_t blen = 0;
		uint8_t byte;
		uint32_t i32;

		switch(id){
			case MQTT_PROP_USER_PROPERTY:
				if(mosquitto_property_read_string_pair(p, id, &k, &s, false)){
					cJSON *pair = cJSON_CreateArray();
					if(user == NULL){
						user = cJSON_AddArrayToObject(o, "user");
					}
					if(pair && user){
						cJSON_AddItemToArray(pair, cJSON_CreateString(k));
						cJSON_AddItemToArray(pair, cJSON_CreateString(s));
						cJSON_AddItemToArray(user, pair);
					}else{
						cJSON_Delete(pair);
					}
					mosquitto_free(k);
					mosquitto_free(s);
				}
				break;
			case MQTT_PROP_CONTENT_TYPE:
				if(mosquitto_property_read_string(p, id, &s, false)){
					cJSON_AddStringToObject(o, "content_type", s);
					mosquitto_free(s);
				}
				break;
			case MQTT_PROP_RESPONSE_TOPIC:
				if(mosquitto_property_read_string(p, id, &s, false)){
					cJSON_AddStringToObject(o, "response_topic", s);
					mosquitto_free(s);
				}
				break;
			case MQTT_PROP_PAYLOAD_FORMAT_INDICATOR:
				if(mosquitto_property_read_byte(p, id, &byte, false)){
					cJSON_AddNumberToObject(o, "payload_format", byte);
				}
				break;
			case MQTT_PROP_CORRELATION_DATA:
				if(mosquitto_property_read_binary(p, id, &bin, &blen, false)){
					char *enc = b64_encode(bin, blen, NULL);
					if(enc){
						cJSON_AddStringToObject(o, "correlation_data", enc);
						free(enc);
					}
					mosquitto_free(bin);
				}
				break;
			case MQTT_PROP_MESSAGE_EXPIRY_INTERVAL:
				if(mosquitto_property_read_int32(p, id, &i32, false)){
					cJSON_AddNumberToObject(o, "message_expiry", i32);
				}
				break;
			default:
				break;
		}
	}
	return o;
}

/* What the properties the cluster forwards (user properties, content type, response topic,
 * correlation data) take in bytes: their strings and data, plus their length prefixes. */
size_t properties_size(const mosquitto_property *props)
{
	const mosquitto_property *p;
	size_t n = 0;

	for(p = props; p; p = mosquitto_property_next(p)){
		int id = mosquitto_property_identifier(p);
		char *s = NULL, *k = NULL;
		void *bin = NULL;
		uint16_t blen = 0;

		switch(id){
			case MQTT_PROP_USER_PROPERTY:
				if(mosquitto_property_read_string_pair(p, id, &k, &s, false)){
					n += 5 + strlen(k) + strlen(s);
					mosquitto_free(k);
					mosquitto_free(s);
				}
				break;
			case MQTT_PROP_CONTENT_TYPE:
			case MQTT_PROP_RESPONSE_TOPIC:
				if(mosquitto_property_read_string(p, id, &s, false)){
					n += 3 + strlen(s);
					mosquitto_free(s);
				}
				break;
			case MQTT_PROP_CORRELATION_DATA:
				if(mosquitto_property_read_binary(p, id, &bin, &blen, false)){
					n += 3 + (size_t)blen;
					mosquitto_free(bin);
				}
				break;
			default:
				n += 5;
				break;
		}
	}
	return n;
}

static bool json_uint(const cJSON *j, double max, uint32_t *out)
{
	if(!cJSON_IsNumber(j)) return false;
	if(j->valuedouble < 0 || j->valuedouble > max || j->valuedouble != (double)(uint64_t)j->valuedouble){
		return false;
	}
	*out = (uint32_t)j->valuedouble;
	return true;
}

/* Build a property list from the protocol's `properties` object. 0 on success. */
int properties_from_json(const cJSON *j, mosquitto_property **props)
{
	const cJSON *it;
	uint32_t v;

	*props = NULL;
	if(j == NULL || cJSON_IsNull(j)) return 0;
	if(!cJSON_IsObject(j)) return -1;

	cJSON_ArrayForEach(it, j){
		const char *key = it->string;
		int rc = 0;

		if(streq(key, "user")){
			const cJSON *pair;
			if(!cJSON_IsArray(it)) goto bad;
			cJSON_ArrayForEach(pair, it){
				const cJSON *k = cJSON_GetArrayItem(pair, 0);
				const cJSON *val = cJSON_GetArrayItem(pair, 1);
				if(!cJSON_IsArray(pair) || cJSON_GetArraySize(pair) != 2
						|| !cJSON_IsString(k) || !cJSON_IsString(val)){
					goto bad;
				}
				rc = mosquitto_property_add_string_pair(props, MQTT_PROP_USER_PROPERTY,
						k->valuestring, val->valuestring);
				if(rc) goto bad;
			}
		}else if(streq(key, "content_type")){
			if(!cJSON_IsString(it)) goto bad;
			rc = mosquitto_property_add_string(props, MQTT_PROP_CONTENT_TYPE, it->valuestring);
		}else if(streq(key, "response_topic")){
			if(!cJSON_IsString(it)) goto bad;
			rc = mosquitto_property_add_string(props, MQTT_PROP_RESPONSE_TOPIC, it->valuestring);
		}else if(streq(key, "payload_format")){
			if(!json_uint(it, 1, &v)) goto bad;
			rc = mosquitto_property_add_byte(props, MQTT_PROP_PAYLOAD_FORMAT_INDICATOR, (uint8_t)v);
		}else if(streq(key, "message_expiry")){
			if(!json_uint(it, 4294967295.0, &v)) goto bad;
			rc = mosquitto_property_add_int32(props, MQTT_PROP_MESSAGE_EXPIRY_INTERVAL, v);
		}else if(streq(key, "correlation_data")){
			unsigned char *bin = NULL;
			size_t blen = 0;
			if(!cJSON_IsString(it) || b64_decode(it->valuestring, &bin, &blen) || blen > UINT16_MAX){
				free(bin);
				goto bad;
			}
			rc = mosquitto_property_add_binary(props, MQTT_PROP_CORRELATION_DATA, bin, (uint16_t)blen);
			free(bin);
		}else{
			goto bad; /* unknown key: refuse rather than silently drop */
		}
		if(rc) goto bad;
	}
	return 0;
bad:
	mosquitto_property_free_all(props);
	return -1;
}

/* Append the optional `subscription_ids` array (each 1..268435455, at most
 * SUBSCRIPTION_IDS_MAX) as Subscription Identifier properties. 0 on success. */
static int subscription_ids_from_json(const cJSON *arr, mosquitto_property **props)
{
	const cJSON *it;
	uint32_t v;

	if(arr == NULL || cJSON_IsNull(arr)) return 0;
	if(!cJSON_IsArray(arr) || cJSON_GetArraySize(arr) > SUBSCRIPTION_IDS_MAX) return -1;
	cJSON_ArrayForEach(it, arr){
		if(!json_uint(it, 268435455.0, &v) || v == 0
				|| mosquitto_property_add_varint(props, MQTT_PROP_SUBSCRIPTION_IDENTIFIER, v)){
			return -1;
		}
	}
	return 0;
}

cJSON *subscription_ids_to_json(const mosquitto_property *props)
{
	const mosquitto_property *p;
	cJSON *arr = NULL;
	uint32_t v;

	for(p = props; p; p = mosquitto_property_next(p)){
		if(mosquitto_property_identifier(p) != MQTT_PROP_SUBSCRIPTION_IDENTIFIER
				|| !mosquitto_property_read_varint(p, MQTT_PROP_SUBSCRIPTION_IDENTIFIER, &v, false)){
			continue;
		}
		if(arr == NULL && (arr = cJSON_CreateArray()) == NULL) return NULL;
		cJSON_AddItemToArray(arr, cJSON_CreateNumber(v));
	}
	return arr;
}

int subscription_ids_copy(const mosquitto_property *from, mosquitto_property **to)
{
	const mosquitto_property *p;
	uint32_t v;

	for(p = from; p; p = mosquitto_property_next(p)){
		if(mosquitto_property_identifier(p) == MQTT_PROP_SUBSCRIPTION_IDENTIFIER
				&& mosquitto_property_read_varint(p, MQTT_PROP_SUBSCRIPTION_IDENTIFIER, &v, false)
				&& mosquitto_property_add_varint(to, MQTT_PROP_SUBSCRIPTION_IDENTIFIER, v)){
			return -1;
		}
	}
	return 0;
}

int message_from_json(const cJSON *item, struct json_message *m)
{
	const cJSON *topic = cJSON_GetObjectItemCaseSensitive(item, "topic");
	const cJSON *payload = cJSON_GetObjectItemCaseSensitive(item, "payload");
	const cJSON *qos = cJSON_GetObjectItemCaseSensitive(item, "qos");

	memset(m, 0, sizeof(*m));
	if(!cJSON_IsObject(item) || !cJSON_IsString(topic) || !cJSON_IsString(payload)
			|| !cJSON_IsNumber(qos) || (qos->valuedouble != 0 && qos->valuedouble != 1
				&& qos->valuedouble != 2)
			|| mosquitto_pub_topic_check(topic->valuestring) != MOSQ_ERR_SUCCESS){
		return -1;
	}
	m->topic = topic->valuestring;
	m->qos = (int)qos->valuedouble;
	if(b64_decode(payload->valuestring, &m->payload, &m->len) || m->len > INT32_MAX
			|| properties_from_json(cJSON_GetObjectItemCaseSensitive(item, "properties"),
				&m->props)
			|| subscription_ids_from_json(
				cJSON_GetObjectItemCaseSensitive(item, "subscription_ids"), &m->props)){
		free(m->payload);
		m->payload = NULL;
		mosquitto_property_free_all(&m->props);
		return -1;
	}
	return 0;
}
