/* Symbol visibility for libexpanse.so: the library is built with hidden visibility and exports
 * only what is marked EXPANSE_API. */
#ifndef EXPANSE_EXPORT_H
#define EXPANSE_EXPORT_H

#if defined(_WIN32)
#  if defined(EXPANSE_BUILDING_LIBRARY)
#    define EXPANSE_API __declspec(dllexport)
#  else
#    define EXPANSE_API __declspec(dllimport)
#  endif
#else
#  define EXPANSE_API __attribute__((visibility("default")))
#endif

#endif /* EXPANSE_EXPORT_H */
