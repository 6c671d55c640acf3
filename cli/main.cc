#include "capsule/cli/cli.h"

int main(int argc, char** argv) { return capsule::cli::Main(argc, argv); }
